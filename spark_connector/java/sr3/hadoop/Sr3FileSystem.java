package sr3.hadoop;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileChecksum;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsStatus;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * The Hadoop FileSystem of {@code sr3:///...}: files and directories on an sr3 ring,
 * through the namespace every peer serves (ring/fs_api.py). Files appear whole when
 * their stream closes; rename with OVERWRITE replaces the target atomically; a create
 * without overwrite on an existing path fails. Append is unsupported.
 */
public class Sr3FileSystem extends FileSystem {
  public static final String SCHEME = "sr3";
  static final String CONF_BLOCK_BYTES = "fs.sr3.block.bytes";
  static final int BLOCK_BYTES_DEFAULT = 4 * 1024 * 1024;
  static final int BLOCK_BYTES_MAX = 64 * 1024 * 1024;
  static final short REPLICATION = 3;
  static final int LIST_ENTRIES_MAX = 1_000_000;

  private URI uri;
  private Sr3Client client;
  private Path workingDirectory;
  private int blockBytes;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    uri = URI.create(SCHEME + ":///");
    client = new Sr3Client(conf);
    long block = conf.getLong(CONF_BLOCK_BYTES, BLOCK_BYTES_DEFAULT);
    if (block < 4096 || block > BLOCK_BYTES_MAX) {
      throw new IOException("sr3: " + CONF_BLOCK_BYTES + " must be in 4096.." + BLOCK_BYTES_MAX);
    }
    blockBytes = (int) block;
    workingDirectory = new Path("/");
  }

  @Override
  public String getScheme() {
    return SCHEME;
  }

  @Override
  public URI getUri() {
    return uri;
  }

  Sr3Client client() {
    return client;
  }

  /** The namespace path of {@code path} ("/a/b"), resolved against the working dir. */
  String pathOf(Path path) {
    Path absolute = path.isAbsolute() ? path : new Path(workingDirectory, path);
    String text = absolute.toUri().getPath();
    if (text.length() > 1 && text.endsWith("/")) {
      text = text.substring(0, text.length() - 1);
    }
    return text.isEmpty() ? "/" : text;
  }

  private FileStatus status(JsonNode stat) {
    boolean directory = "directory".equals(stat.path("type").asText());
    long mtime = stat.path("mtime_ms").asLong(0);
    Path path = makeQualified(new Path(stat.path("path").asText("/")));
    return new FileStatus(
        directory ? 0 : stat.path("size").asLong(0),
        directory,
        REPLICATION,
        blockBytes,
        mtime,
        mtime,
        directory ? FsPermission.getDirDefault() : FsPermission.getFileDefault(),
        "sr3",
        "sr3",
        path);
  }

  @Override
  public FileStatus getFileStatus(Path path) throws IOException {
    String target = pathOf(path);
    Sr3Client.Answer answer = client.lookup(Sr3Client.route("stat", target));
    if (answer.status() != 200) {
      throw Sr3Client.refusal(target, answer);
    }
    return status(answer.json());
  }

  /** Opens with one request: the first block, whose answer also gives the size. */
  @Override
  public FSDataInputStream open(Path path, int bufferSize) throws IOException {
    String target = pathOf(path);
    Sr3Client.Answer first =
        client.read(
            Sr3Client.route("files", target) + "?offset=0&length=" + blockBytes, blockBytes);
    if (first.status() == 409 && "is_directory".equals(first.code())) {
      throw new FileNotFoundException("sr3: " + target + " is a directory");
    }
    if (first.status() != 200) {
      throw Sr3Client.refusal(target, first);
    }
    return new FSDataInputStream(
        new Sr3InputStream(
            client, target, first.fileSize(), first.fileTag(), blockBytes, first.body()));
  }

  @Override
  public FSDataOutputStream create(
      Path path,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    String target = pathOf(path);
    if (!overwrite && exists(path)) {
      throw new FileAlreadyExistsException("sr3: " + target + " exists");
    }
    return new FSDataOutputStream(new Sr3OutputStream(client, target, overwrite), statistics);
  }

  @Override
  public FSDataOutputStream append(Path path, int bufferSize, Progressable progress)
      throws IOException {
    throw new IOException("sr3: append is not supported (" + pathOf(path) + ")");
  }

  private Sr3Client.Answer move(String source, String target, boolean overwrite)
      throws IOException {
    // Fenced when either end is in a held checkpoint's offset or commit log.
    String fence = Sr3Fence.queryFor(target);
    fence = fence.isEmpty() ? Sr3Fence.queryFor(source) : fence;
    String pathQs =
        "/v1/fs/rename?from=" + Sr3Client.quote(source) + "&to=" + Sr3Client.quote(target)
            + "&op=" + Sr3Client.newOp() + (overwrite ? "&overwrite=1" : "") + fence;
    return client.send("POST", pathQs, Sr3Client.Body.NONE);
  }

  /** HDFS's rename: false when the source is missing or the target exists. */
  @Override
  public boolean rename(Path source, Path target) throws IOException {
    String from = pathOf(source);
    String to = pathOf(target);
    try {
      if (getFileStatus(target).isDirectory()) {
        to = (to.equals("/") ? "" : to) + "/" + source.getName();
      }
    } catch (FileNotFoundException e) {
      // the target does not exist: rename to it
    }
    Sr3Client.Answer answer = move(from, to, false);
    if (answer.status() == 200) {
      return true;
    }
    if (answer.status() == 404 || "exists".equals(answer.code())) {
      return false;
    }
    throw Sr3Client.refusal(from, answer);
  }

  /** FileContext's rename: OVERWRITE replaces the target atomically. */
  @Override
  protected void rename(Path source, Path target, Options.Rename... options) throws IOException {
    boolean overwrite = Arrays.asList(options).contains(Options.Rename.OVERWRITE);
    String from = pathOf(source);
    Sr3Client.Answer answer = move(from, pathOf(target), overwrite);
    if (answer.status() != 200) {
      throw Sr3Client.refusal(answer.status() == 404 ? from : pathOf(target), answer);
    }
  }

  @Override
  public boolean delete(Path path, boolean recursive) throws IOException {
    String target = pathOf(path);
    String query = (recursive ? "&recursive=1" : "") + Sr3Fence.queryFor(target);
    String pathQs =
        Sr3Client.route("files", target) + (query.isEmpty() ? "" : "?" + query.substring(1));
    Sr3Client.Answer answer = client.send("DELETE", pathQs, Sr3Client.Body.NONE);
    if (answer.status() != 200) {
      throw Sr3Client.refusal(target, answer);
    }
    return answer.json().path("deleted").asLong(0) > 0;
  }

  @Override
  public FileStatus[] listStatus(Path path) throws IOException {
    String target = pathOf(path);
    List<FileStatus> statuses = new ArrayList<>();
    String after = "";
    while (true) {
      String pathQs =
          Sr3Client.route("list", target) + (after.isEmpty() ? "" : "?after=" + Sr3Client.quote(after));
      Sr3Client.Answer answer = client.lookup(pathQs);
      if (answer.status() != 200) {
        throw Sr3Client.refusal(target, answer);
      }
      JsonNode listing = answer.json();
      JsonNode entries = listing.path("entries");
      for (JsonNode entry : entries) {
        statuses.add(status(entry));
      }
      if (!listing.path("truncated").asBoolean(false)) {
        return statuses.toArray(new FileStatus[0]);
      }
      // Where the next page starts: a page that ran into many deleted entries may hold
      // none; older peers name no "next", and the last entry is where to go on.
      String following = listing.path("next").asText("");
      if (following.isEmpty() && entries.size() > 0) {
        following = entries.get(entries.size() - 1).path("name").asText();
      }
      if (following.isEmpty() || following.equals(after) || statuses.size() > LIST_ENTRIES_MAX) {
        throw new IOException("sr3: " + target + ": a listing without an end");
      }
      after = following;
    }
  }

  /** The ring's bytes on disk (Hadoop's df): stored and free, summed over live peers. */
  @Override
  public FsStatus getStatus(Path path) throws IOException {
    String target = pathOf(path == null ? new Path("/") : path);
    Sr3Client.Answer answer = client.send("GET", Sr3Client.route("usage", target), Sr3Client.Body.NONE);
    if (answer.status() != 200) {
      throw Sr3Client.refusal(target, answer);
    }
    JsonNode usage = answer.json();
    return new FsStatus(
        usage.path("capacity").asLong(0), usage.path("used").asLong(0),
        usage.path("remaining").asLong(0));
  }

  /** The file's content checksum (xxh3-128 of its bytes); null for a directory. */
  @Override
  public FileChecksum getFileChecksum(Path path) throws IOException {
    String target = pathOf(path);
    Sr3Client.Answer answer = client.lookup(Sr3Client.route("stat", target));
    if (answer.status() != 200) {
      throw Sr3Client.refusal(target, answer);
    }
    String hex = answer.json().path("checksum").asText("");
    return hex.isEmpty() ? null : new Sr3FileChecksum(hex);
  }

  @Override
  public boolean mkdirs(Path path, FsPermission permission) throws IOException {
    String target = pathOf(path);
    Sr3Client.Answer answer =
        client.send("POST", Sr3Client.route("mkdirs", target), Sr3Client.Body.NONE);
    if (answer.status() != 200) {
      throw Sr3Client.refusal(target, answer);
    }
    return true;
  }

  @Override
  public void setWorkingDirectory(Path directory) {
    workingDirectory = directory.isAbsolute() ? directory : new Path(workingDirectory, directory);
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDirectory;
  }

  @Override
  public void close() throws IOException {
    try {
      if (client != null) {
        client.close();
      }
    } finally {
      super.close();
    }
  }
}
