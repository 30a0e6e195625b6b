package sr3.hadoop;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.HexFormat;

/**
 * A file being written: kept in memory up to {@link #MEMORY_BYTES_MAX}, then in a
 * temporary file, and sent in one PUT on close, so the file appears whole or not at all
 * (the namespace makes it visible when the PUT answers). Retries resend the same bytes
 * with the same operation id.
 */
final class Sr3OutputStream extends OutputStream {
  static final int MEMORY_BYTES_MAX = 8 * 1024 * 1024;
  static final long FILE_BYTES_MAX = 64L * 1024 * 1024 * 1024;

  private final Sr3Client client;
  private final String path;
  private final boolean overwrite;
  private final String op = Sr3Client.newOp();
  private final MessageDigest digest;
  private byte[] memory = new byte[64 * 1024];
  private int memoryBytes;
  private Path spill;
  private OutputStream spillStream;
  private long written;
  private boolean closed;

  Sr3OutputStream(Sr3Client client, String path, boolean overwrite) {
    this.client = client;
    this.path = path;
    this.overwrite = overwrite;
    try {
      digest = MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("SHA-256 is unavailable", e);
    }
  }

  @Override
  public void write(int b) throws IOException {
    write(new byte[] {(byte) b}, 0, 1);
  }

  @Override
  public synchronized void write(byte[] buffer, int offset, int length) throws IOException {
    if (closed) {
      throw new IOException("sr3: " + path + ": stream closed");
    }
    if (written + length > FILE_BYTES_MAX) {
      throw new IOException("sr3: " + path + ": a file is at most " + FILE_BYTES_MAX + " bytes");
    }
    digest.update(buffer, offset, length);
    written += length;
    if (spillStream == null && memoryBytes + length <= MEMORY_BYTES_MAX) {
      if (memoryBytes + length > memory.length) {
        memory = Arrays.copyOf(memory, Math.min(MEMORY_BYTES_MAX, Math.max(memoryBytes + length, memory.length * 2)));
      }
      System.arraycopy(buffer, offset, memory, memoryBytes, length);
      memoryBytes += length;
      return;
    }
    if (spillStream == null) {
      spill = Files.createTempFile("sr3-upload-", ".part");
      spillStream = Files.newOutputStream(spill);
      spillStream.write(memory, 0, memoryBytes);
      memory = null;
    }
    spillStream.write(buffer, offset, length);
  }

  @Override
  public void flush() {
    // The file becomes visible whole, on close; there is nothing to flush before.
  }

  /** Drops what was written: nothing is sent, nothing appears. */
  synchronized void cancel() {
    if (closed) {
      return;
    }
    closed = true;
    memory = null;
    try {
      if (spillStream != null) {
        spillStream.close();
      }
    } catch (IOException e) {
      // closing what is about to be deleted: nothing to keep
    } finally {
      try {
        if (spill != null) {
          Files.deleteIfExists(spill);
        }
      } catch (IOException e) {
        // a temporary file that cannot be removed is left to the OS's temporary directory
      }
    }
  }

  @Override
  public synchronized void close() throws IOException {
    if (closed) {
      return;
    }
    closed = true;
    try {
      String sha256 = HexFormat.of().formatHex(digest.digest());
      Sr3Client.Body body;
      if (spillStream != null) {
        spillStream.close();
        body = new Sr3Client.Body(null, spill, sha256);
      } else {
        body = new Sr3Client.Body(Arrays.copyOf(memory, memoryBytes), null, sha256);
      }
      // Fenced (a Spark offset or commit log file under a held lease): checked now, when
      // the file is sent, against the lease's latest renewal.
      String pathQs =
          Sr3Client.route("files", path) + "?op=" + op + (overwrite ? "&overwrite=1" : "")
              + Sr3Fence.queryFor(path);
      Sr3Client.Answer answer = client.send("PUT", pathQs, body);
      if (answer.status() != 201) {
        throw Sr3Client.refusal(path, answer);
      }
    } finally {
      memory = null;
      if (spill != null) {
        Files.deleteIfExists(spill);
      }
    }
  }
}
