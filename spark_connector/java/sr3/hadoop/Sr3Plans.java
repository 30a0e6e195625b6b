package sr3.hadoop;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.nio.channels.ClosedByInterruptException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;

/**
 * The local checkpoints whose plans go to the ring before their batches run.
 *
 * <p>For a checkpoint on a local disk (pushed by {@code StateSync}), Spark writes {@code
 * <checkpoint>/offsets/<N>} before it runs batch N: that file (with the source logs
 * written before it) fixes what batch N reads. {@link Sr3CheckpointFileManager} hands each
 * such write of a checkpoint held here to its {@link Sr3PlanHook} when the file is
 * closed, before the file is renamed into place: the hook puts the plan on the ring, and
 * only then does the file appear and the batch run. A hook that throws cancels the write,
 * so the batch fails instead of running unplanned. Whoever resumes the query (a standby,
 * a restart elsewhere) runs batch N with exactly these offsets.
 *
 * <p>Python calls {@link #hook} and {@link #unhook} through py4j ({@code
 * spark._jvm.sr3.hadoop.Sr3Plans}).
 */
public final class Sr3Plans {
  /** Checkpoints one driver may hook at once, at most. */
  static final int HOOKS_MAX = 1024;
  /** An offset log entry is a few hundred bytes per source; this is far above any. */
  static final int OFFSETS_BYTES_MAX = 16 * 1024 * 1024;
  static final int CHECKPOINT_CHARS_MAX = 4096;
  /** The name of the Python exception a hook raises when its query is stopping. */
  static final String CANCELLED = "PlanCancelled";

  private static final Map<String, Sr3PlanHook> HOOKS = new ConcurrentHashMap<>();

  private Sr3Plans() {}

  /** Hands every offset log entry written under {@code checkpointDir} to {@code hook}. */
  public static void hook(String checkpointDir, Sr3PlanHook hook) {
    String checkpoint = checkpointOf(checkpointDir);
    if (hook == null) {
      throw new IllegalArgumentException("sr3: a plan hook is needed");
    }
    if (HOOKS.size() >= HOOKS_MAX && !HOOKS.containsKey(checkpoint)) {
      throw new IllegalStateException("sr3: more than " + HOOKS_MAX + " hooked checkpoints");
    }
    HOOKS.put(checkpoint, hook);
  }

  /** Stops handing the checkpoint's plans over (its query stopped). */
  public static void unhook(String checkpointDir) {
    HOOKS.remove(checkpointOf(checkpointDir));
  }

  /** Whether {@code checkpointDir}'s plans are hooked (for tests and checks). */
  public static boolean hooked(String checkpointDir) {
    return HOOKS.containsKey(checkpointOf(checkpointDir));
  }

  /**
   * {@code out} as it is, or, when {@code path} is the offset log entry of a hooked
   * checkpoint, a stream that hands its bytes to the hook before {@code out} closes.
   */
  static CancellableFSDataOutputStream wrap(Path path, CancellableFSDataOutputStream out) {
    if (HOOKS.isEmpty()) {
      return out;
    }
    Path log = path.getParent();
    if (log == null || !"offsets".equals(log.getName()) || log.getParent() == null) {
      return out;
    }
    long batchId = batchIdOf(path.getName());
    if (batchId < 0) {
      return out;
    }
    String scheme = path.toUri().getScheme();
    if (scheme != null && !"file".equals(scheme)) {
      return out;
    }
    Sr3PlanHook hook = HOOKS.get(checkpointOf(log.getParent().toUri().getPath()));
    if (hook == null) {
      return out;
    }
    PlanStream stream = new PlanStream(path, batchId, hook, out);
    return new CancellableFSDataOutputStream(stream) {
      @Override
      public void cancel() {
        stream.cancel();
      }
    };
  }

  /** The batch id an offset log file name holds (ASCII digits only), or -1. */
  static long batchIdOf(String name) {
    if (name.isEmpty() || name.length() > 18) {
      return -1;
    }
    for (int i = 0; i < name.length(); i++) {
      char c = name.charAt(i);
      if (c < '0' || c > '9') {
        return -1;
      }
    }
    return Long.parseLong(name);
  }

  private static String checkpointOf(String checkpointDir) {
    if (checkpointDir == null
        || !checkpointDir.startsWith("/")
        || checkpointDir.length() > CHECKPOINT_CHARS_MAX) {
      throw new IllegalArgumentException(
          "sr3: a local checkpoint is an absolute path of at most " + CHECKPOINT_CHARS_MAX
              + " characters: " + checkpointDir);
    }
    String path = checkpointDir;
    while (path.length() > 1 && path.endsWith("/")) {
      path = path.substring(0, path.length() - 1);
    }
    return path;
  }

  /**
   * Writes through to Spark's own stream and keeps a copy (bounded); on close, the hook
   * first, then Spark's close (which renames the file into place).
   */
  private static final class PlanStream extends OutputStream {
    private final Path path;
    private final long batchId;
    private final Sr3PlanHook hook;
    private final CancellableFSDataOutputStream out;
    private final ByteArrayOutputStream copy = new ByteArrayOutputStream();
    private boolean done;

    PlanStream(Path path, long batchId, Sr3PlanHook hook, CancellableFSDataOutputStream out) {
      this.path = path;
      this.batchId = batchId;
      this.hook = hook;
      this.out = out;
    }

    @Override
    public void write(int b) throws IOException {
      write(new byte[] {(byte) b}, 0, 1);
    }

    @Override
    public synchronized void write(byte[] buffer, int offset, int length) throws IOException {
      if (copy.size() + (long) length > OFFSETS_BYTES_MAX) {
        throw new IOException(
            "sr3: " + path + ": an offset log entry is at most " + OFFSETS_BYTES_MAX + " bytes");
      }
      copy.write(buffer, offset, length);
      out.write(buffer, offset, length);
    }

    @Override
    public void flush() throws IOException {
      out.flush();
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      try {
        hook.planned(batchId, copy.toByteArray());
      } catch (Exception e) {
        out.cancel();
        String why =
            "sr3: the plan of batch " + batchId + " (" + path + ") is not on the ring, so the"
                + " batch does not run: " + e.getMessage();
        if (interrupted(e)) {
          // The query is being stopped: Spark takes an interruption for a stop, not a failure.
          InterruptedIOException stopped = new InterruptedIOException(why);
          stopped.initCause(e);
          throw stopped;
        }
        throw new IOException(why, e);
      }
      out.close();
    }

    /**
     * The query's thread was interrupted (a stop), or the hook gave up because the query is
     * stopping: Python raises {@code PlanCancelled}, whose name py4j's message carries.
     */
    private static boolean interrupted(Throwable e) {
      if (Thread.currentThread().isInterrupted()) {
        return true;
      }
      String message = e.getMessage();
      if (message != null && message.contains(CANCELLED)) {
        return true;
      }
      for (Throwable cause = e; cause != null; cause = cause.getCause()) {
        if (cause instanceof InterruptedException
            || cause instanceof InterruptedIOException
            || cause instanceof ClosedByInterruptException) {
          return true;
        }
      }
      return false;
    }

    synchronized void cancel() {
      done = true;
      out.cancel();
    }
  }
}
