package sr3.hadoop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Closeable;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.ParentNotDirectoryException;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.security.AccessControlException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Requests to the file namespace of an sr3 ring (ring/fs_api.py): any peer coordinates,
 * so a request goes to one seed and moves on to the next when that one cannot answer
 * (unreachable, timed out, 5xx), at most {@code fs.sr3.retries} rounds over the seeds
 * with a doubling pause between rounds. Writes carry an operation id, the same on every
 * attempt, so a retry of one that went through is recognized by the peers.
 */
final class Sr3Client implements Closeable {
  static final String CONF_RING = "fs.sr3.ring";
  /**
   * A scoped credential ({@code sr3 token scoped}). Every setting that carries a secret has
   * "token" or "secret" in its name: Spark's default {@code spark.redaction.regex} hides such
   * values in its UI and event log in every Spark 4 ("credential" only in the newer ones).
   */
  static final String CONF_TOKEN = "fs.sr3.token";
  /** The former name of {@link #CONF_TOKEN}, still read when that is not set. */
  static final String CONF_CREDENTIAL = "fs.sr3.credential";
  static final String CONF_SECRET = "fs.sr3.secret";
  static final String CONF_TIMEOUT_MS = "fs.sr3.timeout.ms";
  static final String CONF_CONNECT_TIMEOUT_MS = "fs.sr3.connect.timeout.ms";
  static final String CONF_RETRIES = "fs.sr3.retries";
  /** A peer's refusal of a request signed too far from its clock (401). */
  static final String CLOCK_SKEW = "clock_skew";

  /** false: start with the first seed (tests); true: a random one, spreading executors. */
  static final String CONF_SEEDS_SHUFFLE = "fs.sr3.seeds.shuffle";
  static final long TIMEOUT_MS_DEFAULT = 60_000;
  static final long CONNECT_TIMEOUT_MS_DEFAULT = 5_000;
  static final int RETRIES_DEFAULT = 3;
  static final int RETRIES_MAX = 20;
  static final int SEEDS_MAX = 64;
  static final long PAUSE_MS_FIRST = 200;
  static final long PAUSE_MS_MAX = 5_000;
  static final int JSON_BYTES_MAX = 16 * 1024 * 1024;
  static final String EMPTY_SHA256 =
      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final Logger LOG = LoggerFactory.getLogger(Sr3Client.class);
  /** Former setting names this JVM has warned about (once each). */
  private static final Set<String> WARNED = ConcurrentHashMap.newKeySet();

  /** What a request sends: nothing, bytes, or a file (with its SHA-256). */
  record Body(byte[] bytes, Path file, String sha256) {
    static final Body NONE = new Body(null, null, EMPTY_SHA256);

    HttpRequest.BodyPublisher publisher() throws FileNotFoundException {
      if (file != null) {
        return HttpRequest.BodyPublishers.ofFile(file);
      }
      if (bytes != null) {
        return HttpRequest.BodyPublishers.ofByteArray(bytes);
      }
      return HttpRequest.BodyPublishers.noBody();
    }
  }

  /** An answer: status, body, the error code of a refusal, a file's size (-1) and tag (""). */
  record Answer(
      int status, byte[] body, String code, String message, long fileSize, String fileTag) {
    JsonNode json() throws IOException {
      if (body.length > JSON_BYTES_MAX) {
        throw new IOException("sr3: answer above " + JSON_BYTES_MAX + " bytes");
      }
      return JSON.readTree(body);
    }
  }

  private final List<String> seeds;
  private final Signer signer;
  private final HttpClient http;
  /** "https" when fs.sr3.tls.ca is set, else "http". */
  private final String scheme;
  private final Duration timeout;
  private final int retries;
  private volatile int next;

  Sr3Client(Configuration conf) throws IOException {
    String ring = conf.getTrimmed(CONF_RING, "");
    seeds = new ArrayList<>();
    for (String seed : ring.split(",")) {
      if (!seed.isBlank()) {
        seeds.add(seed.trim());
      }
    }
    if (seeds.isEmpty() || seeds.size() > SEEDS_MAX) {
      throw new IOException(
          "sr3: set " + CONF_RING + " to 1.." + SEEDS_MAX + " seeds, host:port,host:port");
    }
    String credential = setting(conf, CONF_TOKEN, CONF_CREDENTIAL);
    String secret = conf.getTrimmed(CONF_SECRET, "");
    if (credential.isEmpty() == secret.isEmpty()) {
      throw new IOException(
          "sr3: set exactly one of " + CONF_TOKEN + " (sr3 token scoped) and " + CONF_SECRET);
    }
    try {
      signer = Signer.of(credential.isEmpty() ? secret : credential);
    } catch (IllegalArgumentException e) {
      throw new IOException("sr3: " + e.getMessage(), e);
    }
    timeout = Duration.ofMillis(bounded(conf, CONF_TIMEOUT_MS, TIMEOUT_MS_DEFAULT, 600_000));
    retries = (int) bounded(conf, CONF_RETRIES, RETRIES_DEFAULT, RETRIES_MAX);
    HttpClient.Builder builder =
        HttpClient.newBuilder()
            .connectTimeout(
                Duration.ofMillis(
                    bounded(conf, CONF_CONNECT_TIMEOUT_MS, CONNECT_TIMEOUT_MS_DEFAULT, 120_000)))
            .version(HttpClient.Version.HTTP_1_1);
    String ca = conf.getTrimmed(Tls.CONF_CA, "");
    String cert = conf.getTrimmed(Tls.CONF_CERT, "");
    String key = setting(conf, Tls.CONF_KEY, Tls.CONF_KEY_FORMER);
    if (ca.isEmpty()) {
      if (!cert.isEmpty() || !key.isEmpty()) {
        throw new IOException("sr3: a client certificate needs " + Tls.CONF_CA + " too");
      }
      scheme = "http";
    } else {
      scheme = "https";
      builder.sslContext(
          Tls.context(
              Tls.pem(Tls.CONF_CA, ca),
              cert.isEmpty() ? "" : Tls.pem(Tls.CONF_CERT, cert),
              key.isEmpty() ? "" : Tls.pem(Tls.CONF_KEY, key)));
    }
    http = builder.build();
    next = conf.getBoolean(CONF_SEEDS_SHUFFLE, true) ? RANDOM.nextInt(seeds.size()) : 0;
  }

  /**
   * The setting {@code name}, else its former name {@code former}: a saved core-site.xml or
   * spark-defaults.conf keeps working, with a warning (once per JVM) that Spark shows the
   * former name's value.
   */
  static String setting(Configuration conf, String name, String former) {
    String value = conf.getTrimmed(name, "");
    if (!value.isEmpty()) {
      return value;
    }
    value = conf.getTrimmed(former, "");
    if (!value.isEmpty() && WARNED.add(former)) {
      LOG.warn(
          "sr3: {} is the former name of {}: rename it, so that Spark hides its value in its"
              + " UI and event log",
          former,
          name);
    }
    return value;
  }

  private static long bounded(Configuration conf, String name, long fallback, long maximum)
      throws IOException {
    long value = conf.getLong(name, fallback);
    if (value < 1 || value > maximum) {
      throw new IOException("sr3: " + name + " must be in 1.." + maximum);
    }
    return value;
  }

  static String newOp() {
    byte[] raw = new byte[12];
    RANDOM.nextBytes(raw);
    return HexFormat.of().formatHex(raw);
  }

  /** Percent-encodes as Python's urllib.parse.quote(text, safe=""). */
  static String quote(String text) {
    StringBuilder out = new StringBuilder();
    for (byte b : text.getBytes(StandardCharsets.UTF_8)) {
      int c = b & 0xff;
      boolean plain =
          (c >= 'A' && c <= 'Z')
              || (c >= 'a' && c <= 'z')
              || (c >= '0' && c <= '9')
              || c == '-'
              || c == '.'
              || c == '_'
              || c == '~';
      if (plain) {
        out.append((char) c);
      } else {
        out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)));
        out.append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
      }
    }
    return out.toString();
  }

  /** "/v1/fs/ROUTE/" + each component of an absolute path, percent-encoded. */
  static String route(String route, String path) {
    StringBuilder out = new StringBuilder("/v1/fs/").append(route).append('/');
    String[] parts = path.split("/");
    boolean first = true;
    for (String part : parts) {
      if (part.isEmpty()) {
        continue;
      }
      if (!first) {
        out.append('/');
      }
      out.append(quote(part));
      first = false;
    }
    return out.toString();
  }

  /**
   * Sends one request, failing over between seeds; every answer below 500 returns, but a
   * 401 clock_skew (that seed's clock or this JVM's is off: the next seed may agree).
   */
  Answer send(String method, String pathQs, Body body) throws IOException {
    IOException last = null;
    long pause = PAUSE_MS_FIRST;
    int attempts = retries * seeds.size();
    for (int attempt = 0; attempt < attempts; attempt++) {
      int index = Math.floorMod(next + attempt, seeds.size());
      String seed = seeds.get(index);
      try {
        Answer answer = once(seed, method, pathQs, body);
        if (answer.status() < 500 && !CLOCK_SKEW.equals(answer.code())) {
          next = index;
          return answer;
        }
        last = new IOException(seed + ": " + answer.status() + " " + answer.message());
      } catch (IOException e) {
        last = e;
      }
      if ((attempt + 1) % seeds.size() == 0 && attempt + 1 < attempts) {
        try {
          Thread.sleep(pause);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new InterruptedIOException("sr3: interrupted while retrying");
        }
        pause = Math.min(PAUSE_MS_MAX, pause * 2);
      }
    }
    throw new IOException(
        "sr3: no peer answered "
            + method
            + " "
            + pathQs
            + " after "
            + attempts
            + " attempts"
            + (last != null ? ": " + describe(last) + plainHint(last) : ""),
        last);
  }

  /** What a peer serving HTTPS does to a plain-HTTP request: close without a byte. */
  private String plainHint(IOException error) {
    String message = String.valueOf(error.getMessage());
    boolean silent = message.contains("received no bytes") || message.contains("reset");
    return scheme.equals("http") && silent
        ? " (if the ring serves HTTPS (TLS), set " + Tls.CONF_CA + ")"
        : "";
  }

  /** One line for why a seed could not be used (a TLS refusal names what was wrong). */
  static String describe(IOException error) {
    Throwable cause = error;
    while (cause != null) {
      if (cause instanceof javax.net.ssl.SSLException) {
        String message = cause.getMessage() != null ? cause.getMessage() : cause.toString();
        if (message.contains("Unsupported or unrecognized SSL message")) {
          return "TLS: the peer does not speak TLS (is it serving plain HTTP?)";
        }
        return "TLS: " + message;
      }
      cause = cause.getCause();
    }
    return error.getMessage() != null ? error.getMessage() : error.toString();
  }

  private Answer once(String seed, String method, String pathQs, Body body) throws IOException {
    HttpRequest.Builder request =
        HttpRequest.newBuilder(URI.create(scheme + "://" + seed + pathQs))
            .timeout(timeout)
            .method(method, body.publisher());
    for (Map.Entry<String, String> header :
        signer.headers(method, seed, pathQs, body.sha256()).entrySet()) {
      request.header(header.getKey(), header.getValue());
    }
    HttpResponse<byte[]> response;
    try {
      response = http.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("sr3: interrupted");
    }
    byte[] payload = response.body();
    long declared = response.headers().firstValueAsLong("Content-Length").orElse(-1);
    if (declared >= 0 && declared != payload.length) {
      throw new IOException(seed + ": answer cut short (" + payload.length + " of " + declared + ")");
    }
    int status = response.statusCode();
    if (status < 400) {
      long fileSize = response.headers().firstValueAsLong("X-SR3-File-Size").orElse(-1);
      String tag = response.headers().firstValue("X-SR3-File-Tag").orElse("");
      return new Answer(status, payload, "", "", fileSize, tag);
    }
    String code = "";
    String message = new String(payload, StandardCharsets.UTF_8);
    try {
      JsonNode error = JSON.readTree(payload);
      code = error.path("error").asText("");
      message = error.path("message").asText(message);
    } catch (IOException e) {
      // not JSON: keep the raw text as the message
    }
    return new Answer(status, payload, code, message, -1, "");
  }

  /** The exception Hadoop's contract names for a refusal. */
  static IOException refusal(String path, Answer answer) {
    String text = "sr3: " + path + ": " + answer.message();
    switch (answer.status()) {
      case 404:
        return new FileNotFoundException(text);
      case 401:
        return new AccessControlException("sr3: credentials refused: " + answer.message());
      case 403:
        return new AccessControlException(text);
      default:
        break;
    }
    switch (answer.code()) {
      case "exists":
        return new FileAlreadyExistsException(text);
      case "parent_is_file":
        return new ParentNotDirectoryException(text);
      case "not_empty":
        return new PathIsNotEmptyDirectoryException(text);
      case "fenced": // another driver took the lease over: this one must stop (Sr3Fence)
        return new IOException(
            answer.message().startsWith("fenced:") ? text : "sr3: " + path + ": fenced: "
                + answer.message());
      default:
        return new IOException(text + " (" + answer.status() + " " + answer.code() + ")");
    }
  }

  @Override
  public void close() {
    // java.net.http.HttpClient holds no resources that need closing before Java 21.
  }
}
