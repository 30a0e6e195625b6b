package sr3.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager for {@code sr3://} ({@code
 * spark.sql.streaming.checkpointFileManagerClass}).
 *
 * <p>Spark's own managers make a file appear atomically by writing a temporary file and
 * renaming it: on the ring that is six requests and several record rounds per state
 * file (stat, create, stat, stat, stat, rename). The namespace already makes a file
 * visible whole exactly when its one PUT answers, so here {@link #createAtomic} writes
 * the final path directly: one request, one record round. {@code overwriteIfPossible}
 * off is the namespace's exact create-if-absent (the close fails with
 * FileAlreadyExistsException when the path exists, as the contract asks), and {@code
 * cancel()} sends nothing, so nothing is left behind.
 *
 * <p>Any other scheme (a {@code file://} checkpoint in the same application) goes to the
 * manager Spark would have picked: FileContext's, or FileSystem's where FileContext has
 * no implementation; the offset log entries of a local checkpoint that {@code StateSync}
 * hooked ({@link Sr3Plans}) reach the ring before they appear.
 */
public class Sr3CheckpointFileManager implements CheckpointFileManager {
  private final CheckpointFileManager other;
  private final Sr3FileSystem fs;
  private final Path root;

  public Sr3CheckpointFileManager(Path path, Configuration conf) throws IOException {
    root = path;
    FileSystem found = path.getFileSystem(conf);
    if (found instanceof Sr3FileSystem sr3) {
      fs = sr3;
      other = null;
    } else {
      fs = null;
      other = defaultManager(path, conf);
    }
  }

  private static CheckpointFileManager defaultManager(Path path, Configuration conf) {
    try {
      return new FileContextBasedCheckpointFileManager(path, conf);
    } catch (Exception e) { // Scala throws the checked UnsupportedFileSystemException undeclared
      if (e instanceof UnsupportedFileSystemException) {
        return new FileSystemBasedCheckpointFileManager(path, conf);
      }
      throw e instanceof RuntimeException runtime ? runtime : Sneaky.<RuntimeException>raise(e);
    }
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    if (other != null) {
      return Sr3Plans.wrap(path, other.createAtomic(path, overwriteIfPossible));
    }
    Sr3OutputStream stream = new Sr3OutputStream(fs.client(), fs.pathOf(path), overwriteIfPossible);
    return new CancellableFSDataOutputStream(stream) {
      @Override
      public void cancel() {
        stream.cancel();
      }
    };
  }

  @Override
  public FSDataInputStream open(Path path) {
    if (other != null) {
      return other.open(path);
    }
    try {
      return fs.open(path);
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public FileStatus[] list(Path path, PathFilter filter) {
    if (other != null) {
      return other.list(path, filter);
    }
    try {
      List<FileStatus> kept = new ArrayList<>();
      for (FileStatus status : fs.listStatus(path)) {
        if (filter.accept(status.getPath())) {
          kept.add(status);
        }
      }
      return kept.toArray(new FileStatus[0]);
    } catch (FileNotFoundException e) {
      return new FileStatus[0];
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public void mkdirs(Path path) {
    if (other != null) {
      other.mkdirs(path);
      return;
    }
    try {
      fs.mkdirs(path);
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public boolean exists(Path path) {
    if (other != null) {
      return other.exists(path);
    }
    try {
      fs.getFileStatus(path);
      return true;
    } catch (FileNotFoundException e) {
      return false;
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  /** Deletes the path, recursively; a missing path is not an error. */
  @Override
  public void delete(Path path) {
    if (other != null) {
      other.delete(path);
      return;
    }
    try {
      fs.delete(path, true);
    } catch (FileNotFoundException e) {
      // already gone: what was asked
    } catch (IOException e) {
      throw unchecked(e);
    }
  }

  @Override
  public boolean isLocal() {
    return other != null && other.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    if (other != null) {
      return other.createCheckpointDirectory();
    }
    Path qualified = fs.makeQualified(root);
    mkdirs(qualified);
    return qualified;
  }

  @Override
  public void close() {
    if (other != null) {
      other.close();
    }
  }

  /**
   * Spark's managers are Scala, whose methods throw IOException without declaring it;
   * the interface seen from Java declares none, so IOExceptions pass through unchanged
   * as far as Spark's callers can tell (they catch IOException and its subclasses).
   */
  private static RuntimeException unchecked(IOException e) {
    return Sneaky.<RuntimeException>raise(e);
  }

  private static final class Sneaky {
    @SuppressWarnings("unchecked")
    static <T extends Throwable> T raise(Throwable t) throws T {
      throw (T) t;
    }
  }
}
