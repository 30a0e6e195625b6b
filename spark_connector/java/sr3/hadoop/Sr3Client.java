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
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
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
 *
 * <p>A peer that stops answering without closing its connections (frozen: SIGSTOP, a paused
 * VM; its kernel still accepts and buffers) costs a request at most {@link #PROBE_AFTER_MS}
 * + {@link #PROBE_TIMEOUT_MS}, as in the Python client (spark_connector/fs_client.py): a
 * request not answered within {@link #PROBE_AFTER_MS} gets its peer probed ({@code GET
 * /v1/health}, answered from memory), again while it waits, one probe of a peer at a time
 * shared by the requests waiting on it; a probe unanswered within {@link #PROBE_TIMEOUT_MS}
 * gives the request up there (its connection closed) and it goes on through the next seed.
 * A peer that answers probes is waited for as long as its answer takes: {@code
 * fs.sr3.timeout.ms} bounds the wait for the answer's first bytes, then for each next
 * bytes of its body (an answer that keeps coming is never cut). Peers commit no write they
 * stalled across or that came just after a stall, nor one whose client left
 * (filesystem/freshness.py), so a write given up on one peer cannot land there after its
 * retry through another and a newer write of the same path.
 *
 * <p>Reads ({@link #lookup}, {@link #read} of at most {@link #HEDGED_READ_BYTES_MAX}) are
 * hedged as well: not answered within the p95 of recent answers of their kind (5 ms to 1 s),
 * they are also sent to the next seed, and the first answer is taken (one hedge per attempt).
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
  /** A write its coordinator paused across, not committed there (425): the next seed. */
  static final String STALLED = "stalled";

  /** false: start with the first seed (tests); true: a random one, spreading executors. */
  static final String CONF_SEEDS_SHUFFLE = "fs.sr3.seeds.shuffle";
  static final long TIMEOUT_MS_DEFAULT = 60_000;
  static final long CONNECT_TIMEOUT_MS_DEFAULT = 5_000;
  static final int RETRIES_DEFAULT = 3;
  static final int RETRIES_MAX = 20;
  static final int SEEDS_MAX = 64;
  static final long PAUSE_MS_FIRST = 200;
  static final long PAUSE_MS_MAX = 5_000;
  /**
   * After a round in which a seed answered 425 stalled, the next waits at least this: a
   * peer refuses writes arriving within 1 s after a stall of its event loop
   * (filesystem.freshness.AFTER_STALL_S), so a round sooner is refused again when every
   * seed paused together (a ring of one seed, a host that paused).
   */
  static final long STALLED_PAUSE_MS = 1_100;
  static final int JSON_BYTES_MAX = 16 * 1024 * 1024;
  /** A request waiting this long gets its peer probed, and again while it waits. */
  static final long PROBE_AFTER_MS = 100;
  /**
   * A probe unanswered within this (connecting included) gives the request up on that peer.
   * Peers count a pause of their event loop above 0.2 s as a stall
   * (filesystem/freshness.py): a probe crosses four turns of it, 0.8 s, under this.
   */
  static final long PROBE_TIMEOUT_MS = 1_000;
  /** Ranged reads hedged to the next seed: at most this many bytes (the stream's blocks). */
  static final long HEDGED_READ_BYTES_MAX = 8L * 1024 * 1024;
  /** A hedge's delay: the p95 of recent answers of its kind, within these bounds. */
  static final long HEDGE_MS_MIN = 5;
  static final long HEDGE_MS_MAX = 1_000;
  static final long HEDGE_MS_UNMEASURED = 250;
  static final int LATENCY_SAMPLES_MAX = 256;
  static final int LATENCY_SAMPLES_MIN = 16;
  static final int LATENCY_RECOMPUTE_EVERY = 16;
  static final String HEALTH = "/v1/health";
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
  private final LatencyWindow lookups = new LatencyWindow();
  private final LatencyWindow reads = new LatencyWindow();
  /** The last probe of each seed: requests waiting on one peer share it. */
  private final Map<String, Probe> probes = new ConcurrentHashMap<>();
  private final AtomicLong hedges = new AtomicLong();
  private final AtomicLong abandoned = new AtomicLong();
  private final AtomicLong probesSent = new AtomicLong();

  /**
   * What the client did around peers that did not answer, so far: reads also sent to the
   * next seed, requests given up on a peer (a probe unanswered, or no bytes of its answer
   * for the request timeout), probes sent.
   */
  record Stats(long hedges, long abandoned, long probes) {}

  /** A liveness probe of a seed: when it was sent, and whether the seed answered. */
  private record Probe(long sentNanos, CompletableFuture<Boolean> alive) {}

  /** An attempt's end: the seed that answered and its answer, or the last error. */
  private record Outcome(
      int index, Answer answer, IOException error, int seeds, boolean stalled) {}

  /** One request to one seed, in flight, and the probe of that seed it waits on. */
  private static final class Lane {
    final int index;
    final String seed;
    final long startedNanos;
    CompletableFuture<HttpResponse<byte[]>> response;
    /** The answer's body once its headers came (null before): what arrived, and when. */
    volatile Collecting body;
    long probeAtNanos;
    CompletableFuture<Boolean> probe;

    Lane(int index, String seed) {
      this.index = index;
      this.seed = seed;
      this.startedNanos = System.nanoTime();
      this.probeAtNanos = startedNanos + TimeUnit.MILLISECONDS.toNanos(PROBE_AFTER_MS);
    }

    /** When the next probe is due: after a pause of the answer's bytes, or of the wait. */
    long probeDueNanos() {
      Collecting arriving = body;
      return arriving == null
          ? probeAtNanos
          : Math.max(
              probeAtNanos,
              arriving.lastNanos + TimeUnit.MILLISECONDS.toNanos(PROBE_AFTER_MS));
    }
  }

  /**
   * An answer's body, collected as it arrives (as BodyHandlers.ofByteArray does), with the
   * time its last bytes came: a body that stops arriving for the request timeout ends the
   * attempt, one that keeps arriving is never cut.
   */
  private static final class Collecting implements HttpResponse.BodySubscriber<byte[]> {
    private final CompletableFuture<byte[]> done = new CompletableFuture<>();
    private final List<ByteBuffer> parts = new ArrayList<>();
    private long size;
    volatile long lastNanos = System.nanoTime();

    @Override
    public CompletionStage<byte[]> getBody() {
      return done;
    }

    @Override
    public void onSubscribe(Flow.Subscription subscription) {
      lastNanos = System.nanoTime();
      subscription.request(Long.MAX_VALUE);
    }

    @Override
    public void onNext(List<ByteBuffer> items) {
      lastNanos = System.nanoTime();
      for (ByteBuffer item : items) {
        size += item.remaining();
        parts.add(item);
      }
    }

    @Override
    public void onError(Throwable error) {
      parts.clear();
      done.completeExceptionally(error);
    }

    @Override
    public void onComplete() {
      if (size > Integer.MAX_VALUE - 8) {
        done.completeExceptionally(new IOException("sr3: an answer above 2 GiB"));
        return;
      }
      byte[] body = new byte[(int) size];
      int offset = 0;
      for (ByteBuffer part : parts) {
        int length = part.remaining();
        part.get(body, offset, length);
        offset += length;
      }
      parts.clear();
      done.complete(body);
    }
  }

  /**
   * The latencies of recent answers of one kind, and the delay after which a read still
   * waiting is hedged: their p95, clamped to [{@link #HEDGE_MS_MIN}, {@link #HEDGE_MS_MAX}];
   * {@link #HEDGE_MS_UNMEASURED} until {@link #LATENCY_SAMPLES_MIN} were seen (as
   * ring.client.view.LatencyWindow).
   */
  static final class LatencyWindow {
    private final long[] samples = new long[LATENCY_SAMPLES_MAX];
    private int count;
    private long added;
    private volatile long delayNanos = TimeUnit.MILLISECONDS.toNanos(HEDGE_MS_UNMEASURED);

    synchronized void add(long nanos) {
      samples[(int) (added % samples.length)] = nanos;
      added++;
      count = Math.min(count + 1, samples.length);
      if (count >= LATENCY_SAMPLES_MIN
          && (added % LATENCY_RECOMPUTE_EVERY == 0 || count == LATENCY_SAMPLES_MIN)) {
        long[] sorted = Arrays.copyOf(samples, count);
        Arrays.sort(sorted);
        long p95 = sorted[Math.max(0, (int) Math.ceil(0.95 * count) - 1)];
        delayNanos =
            Math.min(
                TimeUnit.MILLISECONDS.toNanos(HEDGE_MS_MAX),
                Math.max(TimeUnit.MILLISECONDS.toNanos(HEDGE_MS_MIN), p95));
      }
    }

    long delayNanos() {
      return delayNanos;
    }
  }

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

  /** What the client did around peers that did not answer, so far. */
  Stats stats() {
    return new Stats(hedges.get(), abandoned.get(), probesSent.get());
  }

  /**
   * Sends one request, failing over between seeds; every answer below 500 returns, but a
   * 401 clock_skew (that seed's clock or this JVM's is off: the next seed may agree) and
   * a 425 stalled (that seed paused across the write and did not commit it).
   */
  Answer send(String method, String pathQs, Body body) throws IOException {
    return send(method, pathQs, body, null);
  }

  /** A GET of a stat or a listing page, hedged. */
  Answer lookup(String pathQs) throws IOException {
    return send("GET", pathQs, Body.NONE, lookups);
  }

  /** A GET of {@code length} bytes of a file, hedged when they are few enough. */
  Answer read(String pathQs, long length) throws IOException {
    return send("GET", pathQs, Body.NONE, length <= HEDGED_READ_BYTES_MAX ? reads : null);
  }

  private Answer send(String method, String pathQs, Body body, LatencyWindow hedged)
      throws IOException {
    IOException last = null;
    long pause = PAUSE_MS_FIRST;
    int attempts = retries * seeds.size();
    int attempt = 0;
    boolean stalled = false; // in this round
    while (attempt < attempts) {
      Outcome outcome =
          attempt(Math.floorMod(next + attempt, seeds.size()), method, pathQs, body, hedged);
      if (outcome.answer() != null) {
        next = outcome.index();
        return outcome.answer();
      }
      last = outcome.error() != null ? outcome.error() : last;
      stalled = stalled || outcome.stalled();
      for (int seed = 0; seed < outcome.seeds(); seed++) {
        attempt++;
        if (attempt % seeds.size() == 0 && attempt < attempts) {
          try {
            Thread.sleep(stalled ? Math.max(pause, STALLED_PAUSE_MS) : pause);
            stalled = false;
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("sr3: interrupted while retrying");
          }
          pause = Math.min(PAUSE_MS_MAX, pause * 2);
        }
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

  /**
   * One attempt: the request to {@code seeds[first]}, and for a hedged read to the next
   * seed too once the first has not answered within the hedge delay; the first usable
   * answer, or the last error once every lane failed or was given up (its seed missed a
   * probe).
   */
  private Outcome attempt(int first, String method, String pathQs, Body body, LatencyWindow hedged)
      throws IOException {
    List<Lane> lanes = new ArrayList<>();
    lanes.add(launch(first, method, pathQs, body));
    long hedgeAt =
        hedged != null && seeds.size() > 1
            ? lanes.get(0).startedNanos + hedged.delayNanos()
            : Long.MAX_VALUE;
    int tried = 1;
    IOException last = null;
    boolean stalled = false;
    try {
      while (!lanes.isEmpty()) {
        long now = System.nanoTime();
        for (Iterator<Lane> it = lanes.iterator(); it.hasNext(); ) {
          Lane lane = it.next();
          if (lane.response.isDone()) {
            it.remove();
            try {
              Answer answer = answer(lane.seed, lane.response.join());
              if (answer.status() < 500
                  && !CLOCK_SKEW.equals(answer.code())
                  && !STALLED.equals(answer.code())) {
                if (hedged != null) {
                  hedged.add(System.nanoTime() - lane.startedNanos);
                }
                return new Outcome(lane.index, answer, null, tried, false);
              }
              last = new IOException(lane.seed + ": " + answer.status() + " " + answer.message());
              stalled = stalled || STALLED.equals(answer.code());
            } catch (CompletionException e) {
              last = failure(lane.seed, e.getCause());
            } catch (IOException e) {
              last = e;
            }
          } else if (lane.probe != null && lane.probe.isDone()) {
            if (lane.probe.join()) {
              lane.probe = null;
              lane.probeAtNanos = now + TimeUnit.MILLISECONDS.toNanos(PROBE_AFTER_MS);
            } else {
              it.remove();
              lane.response.cancel(true);
              abandoned.incrementAndGet();
              last =
                  new IOException(
                      lane.seed + ": no answer, and none to a liveness probe within "
                          + PROBE_TIMEOUT_MS + " ms (frozen?)");
            }
          } else if (lane.body != null && now - lane.body.lastNanos > timeout.toNanos()) {
            it.remove();
            lane.response.cancel(true);
            abandoned.incrementAndGet();
            last =
                new IOException(
                    lane.seed + ": no bytes of the answer for " + timeout.toMillis() + " ms");
          } else if (lane.probe == null && now >= lane.probeDueNanos()) {
            lane.probe = probe(lane.seed);
          }
        }
        if (lanes.isEmpty()) {
          break;
        }
        if (tried == 1 && now >= hedgeAt) {
          hedges.incrementAndGet();
          lanes.add(launch((first + 1) % seeds.size(), method, pathQs, body));
          tried = 2;
          continue;
        }
        awaitAny(lanes, tried == 1 ? hedgeAt : Long.MAX_VALUE, now);
      }
      return new Outcome(-1, null, last, tried, stalled);
    } finally {
      for (Lane lane : lanes) {
        lane.response.cancel(true); // closes its connection: the peer sees its client left
      }
    }
  }

  /** Waits until a lane's answer or probe completes, or the next lane is due a probe. */
  private static void awaitAny(List<Lane> lanes, long wakeNanos, long now)
      throws InterruptedIOException {
    List<CompletableFuture<?>> watched = new ArrayList<>();
    for (Lane lane : lanes) {
      watched.add(lane.response);
      if (lane.probe != null) {
        watched.add(lane.probe);
      } else {
        wakeNanos = Math.min(wakeNanos, lane.probeDueNanos());
      }
    }
    try {
      CompletableFuture.anyOf(watched.toArray(new CompletableFuture<?>[0]))
          .get(Math.max(0, wakeNanos - now), TimeUnit.NANOSECONDS);
    } catch (TimeoutException | ExecutionException | CancellationException e) {
      // a lane or probe is due, or one ended (with an error): the caller looks at them
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("sr3: interrupted");
    }
  }

  /** The IOException a failed send reports (a timeout, a refused or broken connection). */
  private static IOException failure(String seed, Throwable cause) {
    if (cause instanceof IOException io) {
      return io;
    }
    return new IOException(seed + ": " + cause, cause);
  }

  /**
   * The probe of {@code seed} still running or sent within {@link #PROBE_AFTER_MS}, else a
   * new one: requests waiting on one peer share its probes.
   */
  private CompletableFuture<Boolean> probe(String seed) {
    return probes
        .compute(
            seed,
            (key, last) -> {
              long now = System.nanoTime();
              if (last != null
                  && (!last.alive().isDone()
                      || now - last.sentNanos() < TimeUnit.MILLISECONDS.toNanos(PROBE_AFTER_MS))) {
                return last;
              }
              probesSent.incrementAndGet();
              HttpRequest request =
                  HttpRequest.newBuilder(URI.create(scheme + "://" + seed + HEALTH))
                      .timeout(Duration.ofMillis(PROBE_TIMEOUT_MS))
                      .GET()
                      .build();
              CompletableFuture<Boolean> alive =
                  http.sendAsync(request, HttpResponse.BodyHandlers.discarding())
                      .orTimeout(PROBE_TIMEOUT_MS, TimeUnit.MILLISECONDS)
                      .handle((response, error) -> error == null);
              return new Probe(now, alive);
            })
        .alive();
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

  private Lane launch(int index, String method, String pathQs, Body body) throws IOException {
    String seed = seeds.get(index);
    Lane lane = new Lane(index, seed);
    HttpRequest.Builder request =
        HttpRequest.newBuilder(URI.create(scheme + "://" + seed + pathQs))
            .timeout(timeout)
            .method(method, body.publisher());
    for (Map.Entry<String, String> header :
        signer.headers(method, seed, pathQs, body.sha256()).entrySet()) {
      request.header(header.getKey(), header.getValue());
    }
    // A new subscriber for each call: the client may send a request again on its own.
    lane.response = http.sendAsync(request.build(), info -> lane.body = new Collecting());
    return lane;
  }

  private static Answer answer(String seed, HttpResponse<byte[]> response) throws IOException {
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
