package sr3.hadoop;

import java.io.DataInput;
import java.io.DataOutput;
import java.io.IOException;
import java.util.HexFormat;
import org.apache.hadoop.fs.FileChecksum;

/**
 * A file's content checksum as the namespace keeps it: xxh3-128 of its bytes (the digest
 * its chunks were written under, or of its inline bytes). Equal bytes give equal
 * checksums whatever their chunking, so {@code distcp -update} between sr3:// paths skips
 * unchanged files, and {@code hadoop fs -checksum} prints it.
 */
public final class Sr3FileChecksum extends FileChecksum {
  static final String ALGORITHM = "XXH3-128";
  private static final int BYTES = 16;
  private byte[] digest;

  public Sr3FileChecksum() {
    this.digest = new byte[BYTES];
  }

  Sr3FileChecksum(String hex) {
    byte[] parsed = HexFormat.of().parseHex(hex);
    if (parsed.length != BYTES) {
      throw new IllegalArgumentException("an XXH3-128 checksum is 16 bytes");
    }
    this.digest = parsed;
  }

  @Override
  public String getAlgorithmName() {
    return ALGORITHM;
  }

  @Override
  public int getLength() {
    return BYTES;
  }

  @Override
  public byte[] getBytes() {
    return digest.clone();
  }

  @Override
  public void write(DataOutput out) throws IOException {
    out.write(digest);
  }

  @Override
  public void readFields(DataInput in) throws IOException {
    byte[] read = new byte[BYTES];
    in.readFully(read);
    digest = read;
  }

  @Override
  public String toString() {
    return ALGORITHM + ":" + HexFormat.of().formatHex(digest);
  }
}
