package sr3.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;

/**
 * {@code sr3://} for FileContext ({@code fs.AbstractFileSystem.sr3.impl}), so that
 * Spark's checkpoint file manager renames with OVERWRITE atomically.
 */
public class Sr3Fs extends DelegateToFileSystem {
  public Sr3Fs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new Sr3FileSystem(), conf, Sr3FileSystem.SCHEME, false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1;
  }
}
