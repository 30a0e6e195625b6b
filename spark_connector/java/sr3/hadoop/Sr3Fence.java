package sr3.hadoop;

import java.io.IOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The leases this JVM writes checkpoints under (ring/lease.py), for a hot-standby driver:
 * while a query's checkpoint is held, every write, rename and delete in its offset and
 * commit logs ({@code <checkpoint>/offsets/}, {@code <checkpoint>/commits/}: two files
 * per batch) carries the lease's key and fence ({@code lease=&fence=}, ring/fs_api.py),
 * and the peer refuses it with 409 "fenced" once another driver took the lease over.
 * State files are not fenced: a batch's state is only used once its commit file exists.
 *
 * <p>The holder also stops on its own clock: a fenced write after {@code validForMillis}
 * (counted from {@link #hold}, which each renewal calls again) fails here, sending
 * nothing, since another driver may take the lease over from then on. Python calls
 * {@link #hold} and {@link #drop} through py4j ({@code spark._jvm.sr3.hadoop.Sr3Fence}).
 */
public final class Sr3Fence {
  /** Queries one driver may hold at once, at most. */
  static final int HOLDS_MAX = 1024;
  /** As ring/lease.py: a lease is at most 600 s, and a fence at most 2^53 - 1. */
  static final long VALID_FOR_MILLIS_MAX = 600_000;
  static final long FENCE_MAX = (1L << 53) - 1;
  static final int LEASE_KEY_CHARS_MAX = 512;
  private static final String SCHEME = Sr3FileSystem.SCHEME + ":";
  private static final String[] FENCED_LOGS = {"/offsets/", "/commits/"};
  private static final Map<String, Holder> HOLDS = new ConcurrentHashMap<>();

  /** One held lease: its record's key, fence, and until when (System.nanoTime) it holds. */
  record Holder(String leaseKey, long fence, long validUntilNanos) {
    /** The query parameters of a write under this lease, after checking it still holds. */
    String query(String path) throws IOException {
      if (System.nanoTime() - validUntilNanos >= 0) {
        throw new IOException(
            "sr3: " + path + ": fenced: the lease " + leaseKey + " (fence " + fence
                + ") lapsed before this write; another driver may hold it now — this driver"
                + " must stop");
      }
      return "lease=" + Sr3Client.quote(leaseKey) + "&fence=" + fence;
    }
  }

  private Sr3Fence() {}

  /**
   * Fences the offset and commit logs of the checkpoint at {@code checkpointPath}
   * ("/spark/q1" or "sr3:///spark/q1") with the lease in record {@code leaseKey} at {@code
   * fence}, for {@code validForMillis} from now; called again at each renewal (the latest
   * call wins).
   */
  public static void hold(
      String checkpointPath, String leaseKey, long fence, long validForMillis) {
    String checkpoint = checkpointOf(checkpointPath);
    if (leaseKey == null || leaseKey.isEmpty() || leaseKey.length() > LEASE_KEY_CHARS_MAX) {
      throw new IllegalArgumentException(
          "sr3: a lease key is 1.." + LEASE_KEY_CHARS_MAX + " characters");
    }
    if (fence < 1 || fence > FENCE_MAX) {
      throw new IllegalArgumentException("sr3: a fence is in 1.." + FENCE_MAX);
    }
    if (validForMillis < 0 || validForMillis > VALID_FOR_MILLIS_MAX) {
      throw new IllegalArgumentException("sr3: validForMillis is in 0.." + VALID_FOR_MILLIS_MAX);
    }
    if (HOLDS.size() >= HOLDS_MAX && !HOLDS.containsKey(checkpoint)) {
      throw new IllegalStateException("sr3: more than " + HOLDS_MAX + " fenced checkpoints");
    }
    long validUntil = System.nanoTime() + validForMillis * 1_000_000;
    HOLDS.put(checkpoint, new Holder(leaseKey, fence, validUntil));
  }

  /** Stops fencing the checkpoint's logs (its query stopped, or gave the lease up). */
  public static void drop(String checkpointPath) {
    HOLDS.remove(checkpointOf(checkpointPath));
  }

  /** The lease a write to the namespace path {@code nsPath} is made under, or null. */
  static Holder forPath(String nsPath) {
    if (HOLDS.isEmpty()) {
      return null;
    }
    for (Map.Entry<String, Holder> held : HOLDS.entrySet()) {
      String checkpoint = held.getKey().equals("/") ? "" : held.getKey();
      for (String log : FENCED_LOGS) {
        String prefix = checkpoint + log;
        if (nsPath.startsWith(prefix) && nsPath.length() > prefix.length()) {
          return held.getValue();
        }
      }
    }
    return null;
  }

  /** "&lease=...&fence=..." for a write to {@code nsPath}, or "" when it is not fenced. */
  static String queryFor(String nsPath) throws IOException {
    Holder holder = forPath(nsPath);
    return holder == null ? "" : "&" + holder.query(nsPath);
  }

  private static String checkpointOf(String checkpointPath) {
    if (checkpointPath == null) {
      throw new IllegalArgumentException("sr3: a checkpoint path is needed");
    }
    String path = checkpointPath;
    if (path.startsWith(SCHEME)) { // sr3:///a/b, or sr3:/a/b as Hadoop's Path prints it
      path = path.substring(SCHEME.length());
      path = path.startsWith("//") ? path.substring(2) : path;
    }
    if (!path.startsWith("/") || path.contains("//")) {
      throw new IllegalArgumentException(
          "sr3: a checkpoint is an absolute path (/a/b or sr3:///a/b): " + checkpointPath);
    }
    while (path.length() > 1 && path.endsWith("/")) {
      path = path.substring(0, path.length() - 1);
    }
    return path;
  }
}
