package sr3.hadoop;

import java.io.EOFException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.hadoop.fs.FSInputStream;

/**
 * A file of the namespace read in blocks (GET with offset and length) that end on
 * multiples of the block size: seekable, with positioned reads that leave the position
 * alone. Every block is checked to be exactly
 * the length asked for; a short answer is an error, never a short file.
 *
 * <p>Blocks after the first name the version the first came with (its tag: version and
 * operation id): the coordinator serves them from that version (without reading the
 * file's record again when it read it lately), or refuses (409 changed) once it no
 * longer knows it, so a stream reads the version it opened, whole, or fails; it never
 * mixes two. Reading on sequentially (a block asked for right after the previous one)
 * fetches the next block in the background, one ahead, on a small pool shared by the
 * JVM ({@link #AHEAD_THREADS_MAX} threads, {@link #AHEAD_QUEUED_MAX} waiting; when it is
 * full the block is fetched when needed). A reader that needs a block whose background
 * fetch has not started yet claims it and fetches it itself, so a reader never waits
 * behind other streams' fetches.
 */
final class Sr3InputStream extends FSInputStream {
  static final int AHEAD_THREADS_MAX = 8;
  static final int AHEAD_QUEUED_MAX = 64;
  private static final ThreadPoolExecutor AHEAD =
      new ThreadPoolExecutor(
          AHEAD_THREADS_MAX,
          AHEAD_THREADS_MAX,
          30,
          TimeUnit.SECONDS,
          new LinkedBlockingQueue<>(AHEAD_QUEUED_MAX),
          runnable -> {
            Thread thread = new Thread(runnable, "sr3-read-ahead");
            thread.setDaemon(true);
            return thread;
          });

  static {
    AHEAD.allowCoreThreadTimeOut(true);
  }

  private final Sr3Client client;
  private final String path;
  private final long size;
  private final String tag;
  private final int blockBytes;
  private long position;
  private byte[] block = new byte[0];
  private long blockStart;
  private boolean closed;
  private CompletableFuture<byte[]> ahead;
  private AtomicBoolean aheadClaimed;
  private long aheadStart = -1;

  /**
   * {@code first}: the file's first block, read when it was opened; {@code tag}: the
   * version it came from ("": unknown, later blocks read whatever is there).
   */
  Sr3InputStream(
      Sr3Client client, String path, long size, String tag, int blockBytes, byte[] first)
      throws IOException {
    if (size < 0 || first.length != Math.min(size, blockBytes)) {
      throw new IOException("sr3: " + path + ": the first block does not match the file's size");
    }
    this.client = client;
    this.path = path;
    this.size = size;
    this.tag = tag;
    this.blockBytes = blockBytes;
    this.block = first;
    this.blockStart = 0;
  }

  private void checkOpen() throws IOException {
    if (closed) {
      throw new IOException("sr3: " + path + ": stream closed");
    }
  }

  private byte[] fetch(long offset, int length) throws IOException {
    String pathQs =
        Sr3Client.route("files", path) + "?offset=" + offset + "&length=" + length
            + (tag.isEmpty() ? "" : "&tag=" + tag);
    Sr3Client.Answer answer = client.read(pathQs, length);
    if (answer.status() != 200) {
      throw Sr3Client.refusal(path, answer);
    }
    if (answer.body().length != length) {
      throw new IOException(
          "sr3: " + path + ": read " + answer.body().length + " of " + length
              + " bytes at " + offset + " (the file changed while it was read?)");
    }
    return answer.body();
  }

  /** Makes the block hold {@code offset}; false at the end of the file. */
  private boolean cover(long offset) throws IOException {
    if (offset >= size) {
      return false;
    }
    if (offset >= blockStart && offset < blockStart + block.length) {
      return true;
    }
    int length = blockLength(offset);
    boolean sequential = offset == blockStart + block.length;
    byte[] fetched = offset == aheadStart ? awaitAhead() : null;
    cancelAhead();
    block = fetched != null ? fetched : fetch(offset, length);
    blockStart = offset;
    if (sequential) {
      readAhead(offset + block.length);
    }
    return true;
  }

  /**
   * The length of the block at {@code offset}: blocks end on multiples of the block size
   * (the ring's chunk size by default), so a read that starts mid-way (a seek) fetches
   * up to the next boundary and the blocks after it are whole chunks, each fetched and
   * verified once by the coordinator rather than two halves of two chunks per block.
   */
  private int blockLength(long offset) {
    return (int) Math.min(blockBytes - offset % blockBytes, size - offset);
  }

  /** Starts fetching the block at {@code offset} in the background, if there is one. */
  private void readAhead(long offset) {
    if (offset >= size) {
      return;
    }
    int length = blockLength(offset);
    AtomicBoolean claimed = new AtomicBoolean();
    try {
      ahead =
          CompletableFuture.supplyAsync(
              () -> {
                if (!claimed.compareAndSet(false, true)) {
                  return null; // the reader took this block over before it started
                }
                try {
                  return fetch(offset, length);
                } catch (IOException e) {
                  throw new UncheckedIOException(e);
                }
              },
              AHEAD);
      aheadClaimed = claimed;
      aheadStart = offset;
    } catch (RejectedExecutionException e) {
      ahead = null; // the pool is busy: this block is fetched when it is needed
      aheadClaimed = null;
      aheadStart = -1;
    }
  }

  /** The block read ahead at {@code offset}, or null: not started yet, so taken over. */
  private byte[] awaitAhead() throws IOException {
    if (aheadClaimed.compareAndSet(false, true)) {
      return null; // queued behind other streams' fetches: the caller fetches it now
    }
    try {
      return ahead.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("sr3: " + path + ": interrupted");
    } catch (ExecutionException | CancellationException e) {
      Throwable cause = e.getCause();
      if (cause instanceof UncheckedIOException unchecked) {
        throw unchecked.getCause();
      }
      throw new IOException("sr3: " + path + ": reading ahead failed", cause == null ? e : cause);
    } finally {
      ahead = null;
      aheadClaimed = null;
      aheadStart = -1;
    }
  }

  /** Drops the block read ahead (a fetch not started yet never starts). */
  private void cancelAhead() {
    if (ahead != null) {
      aheadClaimed.set(true);
      ahead.cancel(false);
      ahead = null;
      aheadClaimed = null;
      aheadStart = -1;
    }
  }

  @Override
  public synchronized int read() throws IOException {
    checkOpen();
    if (!cover(position)) {
      return -1;
    }
    int value = block[(int) (position - blockStart)] & 0xff;
    position++;
    return value;
  }

  @Override
  public synchronized int read(byte[] buffer, int offset, int length) throws IOException {
    checkOpen();
    if (length == 0) {
      return 0;
    }
    if (!cover(position)) {
      return -1;
    }
    int start = (int) (position - blockStart);
    int count = Math.min(length, block.length - start);
    System.arraycopy(block, start, buffer, offset, count);
    position += count;
    return count;
  }

  @Override
  public synchronized int read(long at, byte[] buffer, int offset, int length)
      throws IOException {
    checkOpen();
    if (at < 0) {
      throw new EOFException("sr3: negative position " + at);
    }
    if (at >= size || length == 0) {
      return length == 0 ? 0 : -1;
    }
    int count = (int) Math.min(length, size - at);
    if (at >= blockStart && at + count <= blockStart + block.length) {
      System.arraycopy(block, (int) (at - blockStart), buffer, offset, count);
      return count;
    }
    byte[] data = fetch(at, count);
    System.arraycopy(data, 0, buffer, offset, count);
    return count;
  }

  @Override
  public synchronized void seek(long target) throws IOException {
    checkOpen();
    if (target < 0 || target > size) {
      throw new EOFException("sr3: cannot seek to " + target + " in a file of " + size + " bytes");
    }
    position = target;
  }

  @Override
  public synchronized long getPos() {
    return position;
  }

  @Override
  public boolean seekToNewSource(long target) {
    return false;
  }

  @Override
  public synchronized int available() throws IOException {
    checkOpen();
    return (int) Math.min(Integer.MAX_VALUE, size - position);
  }

  @Override
  public synchronized void close() {
    closed = true;
    block = new byte[0];
    cancelAhead();
  }
}
