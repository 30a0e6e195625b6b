package sr3.hadoop;

import java.io.BufferedReader;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.List;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileChecksum;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * The FileSystem contract Spark relies on, checked through the Hadoop API against a
 * running ring. One line per check (PASS or FAIL, name, detail); exit code 1 if any
 * failed.
 *
 * <pre>
 *   ContractCheck contract ROOT          every check, under the sr3 path ROOT
 *   ContractCheck read-across-kill PATH  write PATH (40 MiB), read its first block, print
 *                                        READY, wait for a line on stdin, read the rest
 *   ContractCheck write-across-kill PATH write 20 MiB to PATH, print READY, wait for a
 *                                        line, write 20 MiB more, close, read it back
 *   ContractCheck frozen-seed ROOT       writes and reads under ROOT, each through a
 *                                        FileSystem of its own whose first seed does not
 *                                        answer (frozen, or stalled mid-answer)
 * </pre>
 *
 * The ring and credential come from the system properties fs.sr3.ring and
 * fs.sr3.token (or fs.sr3.secret).
 */
public final class ContractCheck {
  private static final int MIB = 1024 * 1024;
  private final List<String> failures = new ArrayList<>();
  private final FileSystem fs;
  private final Configuration conf;

  private ContractCheck(Configuration conf) throws IOException {
    this.conf = conf;
    this.fs = FileSystem.get(java.net.URI.create("sr3:///"), conf);
  }

  private interface Check {
    String run() throws Exception;
  }

  private interface Action {
    Object run() throws Exception;
  }

  private interface FsCheck {
    String run(FileSystem own) throws Exception;
  }

  private void check(String name, Check check) {
    try {
      String detail = check.run();
      System.out.println("PASS " + name + (detail.isEmpty() ? "" : " " + detail));
    } catch (Throwable e) {
      failures.add(name);
      System.out.println("FAIL " + name + " " + e);
    }
    System.out.flush();
  }

  private static void expect(boolean condition, String what) {
    if (!condition) {
      throw new AssertionError(what);
    }
  }

  private static byte[] bytes(long seed, int size) {
    byte[] data = new byte[size];
    new Random(seed).nextBytes(data);
    return data;
  }

  private void write(Path path, byte[] data, boolean overwrite) throws IOException {
    try (FSDataOutputStream out = fs.create(path, overwrite)) {
      int offset = 0;
      while (offset < data.length) {
        int length = Math.min(1_000_003, data.length - offset);
        out.write(data, offset, length);
        offset += length;
      }
    }
  }

  private byte[] readAll(Path path) throws IOException {
    long size = fs.getFileStatus(path).getLen();
    byte[] data = new byte[(int) size];
    try (FSDataInputStream in = fs.open(path)) {
      in.readFully(0, data);
    }
    return data;
  }

  private static <T extends Throwable> T thrown(Class<T> type, Action body) throws Exception {
    try {
      body.run();
    } catch (Throwable e) {
      if (type.isInstance(e)) {
        return type.cast(e);
      }
      throw new AssertionError("expected " + type.getSimpleName() + ", got " + e, e);
    }
    throw new AssertionError("expected " + type.getSimpleName() + ", nothing thrown");
  }

  private void contract(String root) throws Exception {
    Path base = new Path(root);
    byte[] small = bytes(1, 1000);
    byte[] large = bytes(2, 20 * MIB + 12345);
    check("create and read a small file", () -> {
      write(new Path(base, "small"), small, false);
      expect(Arrays.equals(readAll(new Path(base, "small")), small), "bytes differ");
      return "";
    });
    check("create and read a file above the memory buffer (spilled)", () -> {
      write(new Path(base, "dir/large.bin"), large, false);
      expect(Arrays.equals(readAll(new Path(base, "dir/large.bin")), large), "bytes differ");
      return large.length + " bytes";
    });
    check("seeks and positioned reads", () -> {
      Random random = new Random(3);
      try (FSDataInputStream in = fs.open(new Path(base, "dir/large.bin"))) {
        for (int i = 0; i < 40; i++) {
          int at = random.nextInt(large.length);
          int length = Math.min(random.nextInt(3 * MIB) + 1, large.length - at);
          byte[] got = new byte[length];
          if (i % 2 == 0) {
            in.seek(at);
            in.readFully(got);
            expect(in.getPos() == at + length, "position after read");
          } else {
            long before = in.getPos();
            in.readFully(at, got);
            expect(in.getPos() == before, "a positioned read moved the position");
          }
          expect(Arrays.equals(got, Arrays.copyOfRange(large, at, at + length)), "range " + at);
        }
        in.seek(large.length);
        expect(in.read() == -1, "read at the end");
      }
      return "";
    });
    check("a file replaced while a stream reads it: the version opened, or an error", () -> {
      Path replaced = new Path(base, "dir/replaced.bin");
      byte[] before = bytes(31, 12 * MIB + 7);
      write(replaced, before, false);
      byte[] got = new byte[before.length];
      String outcome;
      try (FSDataInputStream in = fs.open(replaced)) {
        in.readFully(got, 0, MIB);
        write(replaced, bytes(32, 12 * MIB + 7), true);
        try {
          in.readFully(got, MIB, before.length - MIB);
          expect(Arrays.equals(got, before), "bytes of the new version in the stream");
          outcome = "read the version it opened";
        } catch (IOException refused) {
          expect(refused.getMessage().contains("changed"), "refused with " + refused);
          outcome = "refused: changed";
        }
      }
      expect(Arrays.equals(readAll(replaced), bytes(32, 12 * MIB + 7)), "new opens see the new");
      return outcome;
    });
    check("getFileStatus: sizes, types, mtimes", () -> {
      FileStatus file = fs.getFileStatus(new Path(base, "dir/large.bin"));
      FileStatus dir = fs.getFileStatus(new Path(base, "dir"));
      expect(file.isFile() && file.getLen() == large.length, "file status " + file);
      expect(dir.isDirectory(), "dir status " + dir);
      long now = System.currentTimeMillis();
      expect(Math.abs(now - file.getModificationTime()) < 600_000, "mtime " + file.getModificationTime());
      return "";
    });
    check("missing paths throw FileNotFoundException", () -> {
      thrown(FileNotFoundException.class, () -> fs.getFileStatus(new Path(base, "nothing")));
      thrown(FileNotFoundException.class, () -> fs.listStatus(new Path(base, "nothing")));
      thrown(FileNotFoundException.class, () -> fs.open(new Path(base, "nothing")));
      expect(!fs.exists(new Path(base, "nothing")), "exists");
      return "";
    });
    check("create without overwrite on an existing file fails", () -> {
      thrown(FileAlreadyExistsException.class, () -> {
        write(new Path(base, "small"), bytes(9, 10), false);
        return "";
      });
      expect(Arrays.equals(readAll(new Path(base, "small")), small), "the file changed");
      write(new Path(base, "small"), bytes(9, 10), true);
      expect(Arrays.equals(readAll(new Path(base, "small")), bytes(9, 10)), "overwrite");
      return "";
    });
    check("listStatus and mkdirs", () -> {
      fs.mkdirs(new Path(base, "empty/inner"));
      FileStatus[] listed = fs.listStatus(base);
      List<String> names = new ArrayList<>();
      for (FileStatus status : listed) {
        names.add(status.getPath().getName() + (status.isDirectory() ? "/" : ""));
      }
      expect(names.equals(List.of("dir/", "empty/", "small")), "listed " + names);
      expect(fs.getFileStatus(new Path(base, "empty/inner")).isDirectory(), "mkdirs");
      return names.toString();
    });
    check("rename: to a free path, refused onto an existing file, into a directory", () -> {
      write(new Path(base, "r/a"), bytes(4, 100), false);
      write(new Path(base, "r/b"), bytes(5, 100), false);
      expect(!fs.rename(new Path(base, "r/a"), new Path(base, "r/b")), "renamed onto a file");
      expect(Arrays.equals(readAll(new Path(base, "r/b")), bytes(5, 100)), "target changed");
      expect(fs.rename(new Path(base, "r/a"), new Path(base, "r/c")), "rename to a free path");
      expect(!fs.exists(new Path(base, "r/a")), "source left");
      expect(!fs.rename(new Path(base, "r/missing"), new Path(base, "r/d")), "missing source");
      fs.mkdirs(new Path(base, "r/into"));
      expect(fs.rename(new Path(base, "r/c"), new Path(base, "r/into")), "rename into a dir");
      expect(Arrays.equals(readAll(new Path(base, "r/into/c")), bytes(4, 100)), "moved bytes");
      return "";
    });
    check("any UTF-8 name: spaces, Spark's %XX escapes, '=', non-ASCII letters", () -> {
      Path table = new Path(base, "names");
      Path partition = new Path(table, "city=S%C3%A3o Paulo");
      Path file = new Path(partition, "part 0 \u00e9.parquet");
      write(file, bytes(6, 100), false);
      expect(Arrays.equals(readAll(file), bytes(6, 100)), "bytes differ");
      FileStatus[] listed = fs.listStatus(partition);
      expect(listed.length == 1, "listed " + Arrays.toString(listed));
      expect(listed[0].getPath().equals(fs.makeQualified(file)), "as " + listed[0].getPath());
      String name = fs.listStatus(table)[0].getPath().getName();
      expect(name.equals("city=S%C3%A3o Paulo"), "the partition listed as " + name);
      Path moved = new Path(partition, "moved 100%");
      expect(fs.rename(file, moved), "rename");
      expect(fs.exists(moved) && !fs.exists(file), "moved");
      return "";
    });
    check("rename of a directory: the whole tree moves; into an existing directory", () -> {
      Path tree = new Path(base, "tree/attempt_0");
      write(new Path(tree, "part-0"), bytes(7, 100), false);
      write(new Path(tree, "city=a%2Fb/part-1"), bytes(8, 3 * MIB), false);
      expect(fs.rename(tree, new Path(base, "tree/task_0")), "rename to a free path");
      expect(!fs.exists(tree), "the source is left");
      Path moved = new Path(base, "tree/task_0/city=a%2Fb/part-1");
      expect(Arrays.equals(readAll(moved), bytes(8, 3 * MIB)), "moved bytes");
      fs.mkdirs(new Path(base, "tree/out"));
      expect(fs.rename(new Path(base, "tree/task_0"), new Path(base, "tree/out")), "into");
      expect(fs.exists(new Path(base, "tree/out/task_0/part-0")), "moved into the directory");
      return "";
    });
    check("getFileChecksum: equal bytes equal checksums, whatever the path or size", () -> {
      write(new Path(base, "sum/a"), bytes(10, 5 * MIB), false);
      write(new Path(base, "sum/b"), bytes(10, 5 * MIB), false);
      write(new Path(base, "sum/c"), bytes(11, 5 * MIB), false);
      write(new Path(base, "sum/small"), bytes(10, 100), false);
      FileChecksum a = fs.getFileChecksum(new Path(base, "sum/a"));
      FileChecksum b = fs.getFileChecksum(new Path(base, "sum/b"));
      FileChecksum c = fs.getFileChecksum(new Path(base, "sum/c"));
      expect(a != null && a.equals(b), "equal bytes: " + a + " " + b);
      expect(!a.equals(c), "different bytes, the same checksum");
      expect(fs.getFileChecksum(new Path(base, "sum/small")) != null, "an inline file has one");
      expect(fs.getFileChecksum(new Path(base, "sum")) == null, "a directory has none");
      return a.toString();
    });
    check("FileContext rename OVERWRITE replaces; NONE refuses", () -> {
      FileContext fc = FileContext.getFileContext(java.net.URI.create("sr3:///"), conf);
      write(new Path(base, "fc/tmp"), bytes(6, 5000), false);
      write(new Path(base, "fc/final"), bytes(7, 5000), false);
      thrown(FileAlreadyExistsException.class, () -> {
        fc.rename(new Path(base, "fc/tmp"), new Path(base, "fc/final"), Options.Rename.NONE);
        return "";
      });
      fc.rename(new Path(base, "fc/tmp"), new Path(base, "fc/final"), Options.Rename.OVERWRITE);
      expect(Arrays.equals(readAll(new Path(base, "fc/final")), bytes(6, 5000)), "replaced");
      expect(!fs.exists(new Path(base, "fc/tmp")), "source left");
      try (FSDataOutputStream out =
          fc.create(new Path(base, "fc/created"), EnumSet.of(CreateFlag.CREATE, CreateFlag.OVERWRITE))) {
        out.write(small);
      }
      expect(Arrays.equals(readAll(new Path(base, "fc/created")), small), "FileContext create");
      return "";
    });
    check("16 threads create one path without overwrite: exactly one wins", () -> {
      Path contested = new Path(base, "contested");
      ExecutorService pool = Executors.newFixedThreadPool(16);
      List<Future<Boolean>> results = new ArrayList<>();
      for (int i = 0; i < 16; i++) {
        final int writer = i;
        Callable<Boolean> create = () -> {
          try (FSDataOutputStream out = fs.create(contested, false)) {
            out.write(("writer " + writer).getBytes(StandardCharsets.UTF_8));
          } catch (FileAlreadyExistsException e) {
            return false;
          }
          return true;
        };
        results.add(pool.submit(create));
      }
      int wins = 0;
      for (Future<Boolean> result : results) {
        wins += result.get() ? 1 : 0;
      }
      pool.shutdown();
      expect(wins == 1, wins + " writers won");
      String text = new String(readAll(contested), StandardCharsets.UTF_8);
      expect(text.startsWith("writer "), "content " + text);
      return "";
    });
    check("delete: a file, a non-empty directory only recursively", () -> {
      expect(fs.delete(new Path(base, "small"), false), "file delete");
      expect(!fs.exists(new Path(base, "small")), "file still there");
      thrown(IOException.class, () -> fs.delete(new Path(base, "dir"), false));
      expect(fs.delete(new Path(base, "dir"), true), "recursive delete");
      expect(!fs.exists(new Path(base, "dir/large.bin")), "child still there");
      expect(!fs.delete(new Path(base, "nothing"), false), "deleting nothing");
      return "";
    });
    check("append is unsupported", () -> {
      thrown(IOException.class, () -> fs.append(new Path(base, "contested")));
      return "";
    });
    checkpointManager(new Path(base, "manager"));
  }

  private static void writeTo(OutputStream out, byte[] data) throws IOException {
    out.write(data, 0, data.length / 2);
    out.write(data, data.length / 2, data.length - data.length / 2);
  }

  /** Spark's checkpoint file manager for sr3:// (what state stores and logs write with). */
  private void checkpointManager(Path base) throws Exception {
    Path qualified = fs.makeQualified(base);
    Sr3CheckpointFileManager manager = new Sr3CheckpointFileManager(qualified, conf);
    byte[] first = bytes(21, 3000);
    byte[] second = bytes(22, 300_000);
    check("manager: createAtomic appears whole on close, not before", () -> {
      Path file = new Path(qualified, "1.delta");
      try (CheckpointFileManager.CancellableFSDataOutputStream out =
          manager.createAtomic(file, false)) {
        writeTo(out, first);
        expect(!manager.exists(file), "visible before close");
      }
      expect(Arrays.equals(readAll(file), first), "bytes differ");
      return "";
    });
    check("manager: without overwriteIfPossible an existing file fails and stays", () -> {
      Path file = new Path(qualified, "1.delta");
      thrown(FileAlreadyExistsException.class, () -> {
        try (CheckpointFileManager.CancellableFSDataOutputStream out =
            manager.createAtomic(file, false)) {
          writeTo(out, second);
        }
        return "";
      });
      expect(Arrays.equals(readAll(file), first), "the file changed");
      return "";
    });
    check("manager: overwriteIfPossible replaces (a large file, in chunks)", () -> {
      Path file = new Path(qualified, "1.delta");
      try (CheckpointFileManager.CancellableFSDataOutputStream out =
          manager.createAtomic(file, true)) {
        writeTo(out, second);
      }
      expect(Arrays.equals(readAll(file), second), "not replaced");
      try (FSDataInputStream in = manager.open(file)) {
        byte[] got = new byte[second.length];
        in.readFully(0, got);
        expect(Arrays.equals(got, second), "open");
      }
      return "";
    });
    check("manager: cancel leaves nothing, close after cancel sends nothing", () -> {
      Path file = new Path(qualified, "2.delta");
      CheckpointFileManager.CancellableFSDataOutputStream out = manager.createAtomic(file, false);
      writeTo(out, first);
      out.cancel();
      out.close();
      expect(!manager.exists(file), "a cancelled file appeared");
      return "";
    });
    check("manager: list with a filter, mkdirs, delete (missing paths too)", () -> {
      manager.mkdirs(new Path(qualified, "sub/inner"));
      List<String> names = new ArrayList<>();
      for (FileStatus status : manager.list(qualified, p -> !p.getName().startsWith("s"))) {
        names.add(status.getPath().getName());
      }
      expect(names.equals(List.of("1.delta")), "listed " + names);
      expect(manager.list(new Path(qualified, "nothing")).length == 0, "listing nothing");
      manager.delete(new Path(qualified, "1.delta"));
      manager.delete(new Path(qualified, "nothing"));
      manager.delete(new Path(qualified, "sub"));
      expect(!manager.exists(new Path(qualified, "1.delta")), "file left");
      expect(!manager.exists(new Path(qualified, "sub/inner")), "directory left");
      expect(!manager.isLocal(), "sr3 is not local");
      expect(manager.createCheckpointDirectory().equals(qualified), "checkpoint directory");
      expect(fs.getFileStatus(qualified).isDirectory(), "no directory made");
      return "";
    });
    check("manager: another scheme goes to Spark's own manager", () -> {
      java.nio.file.Path local = Files.createTempDirectory("sr3-manager-");
      Path localRoot = new Path(local.toUri());
      Sr3CheckpointFileManager other = new Sr3CheckpointFileManager(localRoot, conf);
      try (CheckpointFileManager.CancellableFSDataOutputStream out =
          other.createAtomic(new Path(localRoot, "1.delta"), false)) {
        writeTo(out, first);
      }
      expect(other.isLocal(), "file:// is local");
      expect(Arrays.equals(Files.readAllBytes(local.resolve("1.delta")), first), "bytes differ");
      other.delete(localRoot);
      return "";
    });
  }

  private static String awaitLine() throws IOException {
    System.out.println("READY");
    System.out.flush();
    return new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
  }

  private void readAcrossKill(String file) throws Exception {
    Path path = new Path(file);
    byte[] data = bytes(11, 40 * MIB);
    write(path, data, true);
    check("a read goes on through another peer after a kill", () -> {
      byte[] got = new byte[data.length];
      try (FSDataInputStream in = fs.open(path)) {
        in.readFully(got, 0, MIB);
        awaitLine();
        in.readFully(got, MIB, data.length - MIB);
      }
      expect(Arrays.equals(got, data), "bytes differ");
      return "";
    });
  }

  private void writeAcrossKill(String file) throws Exception {
    Path path = new Path(file);
    byte[] data = bytes(12, 40 * MIB);
    check("a write goes on through another peer after a kill", () -> {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(data, 0, data.length / 2);
        awaitLine();
        out.write(data, data.length / 2, data.length - data.length / 2);
      }
      expect(Arrays.equals(readAll(path), data), "bytes differ");
      return "";
    });
  }

  /**
   * Each operation through a FileSystem of its own, whose client starts at the first seed
   * (fs.sr3.seeds.shuffle=false), which the test froze (SIGSTOP) before, or which stops its
   * answers midway: it must complete, right, having given its first request up on that
   * seed or hedged it to the next (the client's counters).
   */
  private void frozenSeed(String root) throws Exception {
    Path base = new Path(root);
    Path file = new Path(base, "file");
    Path dir = new Path(base, "dir");
    byte[] older = bytes(31, 300_000);
    byte[] newer = bytes(32, 6 * MIB);
    aroundFrozen("a create goes around a frozen seed", own -> written(own, file, older));
    aroundFrozen("an overwrite goes around a frozen seed", own -> written(own, file, newer));
    aroundFrozen("mkdirs goes around a frozen seed", own -> own.mkdirs(dir) ? "" : "existed");
    aroundFrozen(
        "a small create goes around a frozen seed",
        own -> written(own, new Path(dir, "gone"), new byte[] {1}));
    aroundFrozen(
        "a rename goes around a frozen seed",
        own -> {
          expect(own.rename(new Path(dir, "gone"), new Path(dir, "moved")), "not renamed");
          return "";
        });
    aroundFrozen(
        "a delete goes around a frozen seed",
        own -> {
          expect(own.delete(new Path(dir, "moved"), false), "not deleted");
          return "";
        });
    aroundFrozen(
        "a stat goes around a frozen seed",
        own -> {
          expect(own.getFileStatus(file).getLen() == newer.length, "size");
          return "";
        });
    aroundFrozen(
        "a listing goes around a frozen seed",
        own -> {
          List<String> names = new ArrayList<>();
          for (FileStatus status : own.listStatus(base)) {
            names.add(status.getPath().getName());
          }
          expect(names.equals(List.of("dir", "file")), "listed " + names);
          return "";
        });
    aroundFrozen(
        "a read goes around a frozen seed",
        own -> {
          byte[] got = new byte[newer.length];
          try (FSDataInputStream in = own.open(file)) {
            in.readFully(0, got);
          }
          expect(Arrays.equals(got, newer), "bytes differ");
          return "";
        });
  }

  private static String written(FileSystem own, Path path, byte[] data) throws IOException {
    try (FSDataOutputStream out = own.create(path, true)) {
      out.write(data);
    }
    return "";
  }

  private void aroundFrozen(String name, FsCheck action) {
    check(
        name,
        () -> {
          FileSystem own = FileSystem.newInstance(java.net.URI.create("sr3:///"), conf);
          try {
            String detail = action.run(own);
            Sr3Client.Stats stats = ((Sr3FileSystem) own).client().stats();
            expect(stats.abandoned() + stats.hedges() >= 1, "only the frozen seed: " + stats);
            return (detail + " " + stats).trim();
          } finally {
            own.close();
          }
        });
  }

  /**
   * Writes a file of ten blocks and a bit, says READY, waits for a line (the test reads
   * the peers' counters), then reads it from an offset in its second block to the end.
   */
  private void readAfterSeek(String file) throws Exception {
    Path path = new Path(file);
    int blockBytes = Sr3FileSystem.BLOCK_BYTES_DEFAULT;
    byte[] data = bytes(13, 10 * blockBytes + 1000);
    write(path, data, true);
    int from = blockBytes + MIB + 17; // past the block read when the file opened
    check("a read from a seek to the end", () -> {
      byte[] got = new byte[data.length - from];
      try (FSDataInputStream in = fs.open(path)) {
        awaitLine();
        in.seek(from);
        in.readFully(got);
      }
      expect(Arrays.equals(got, Arrays.copyOfRange(data, from, data.length)), "bytes differ");
      return "";
    });
  }

  /**
   * Writes a file, then twice says READY and waits for a line (the test freezes and thaws
   * the only seed meanwhile): an overwrite, then a delete, which the thawed seed refuses
   * with 425 stalled at first, must each go through once the client waited that out.
   */
  private void thawedSeed(String file) throws Exception {
    Path path = new Path(file);
    byte[] newer = bytes(41, 20_000);
    write(path, bytes(40, 1000), true);
    awaitLine();
    check("an overwrite just after the only seed thawed", () -> {
      write(path, newer, true);
      byte[] got = new byte[newer.length];
      try (FSDataInputStream in = fs.open(path)) {
        in.readFully(0, got);
      }
      expect(Arrays.equals(got, newer), "bytes differ");
      return "";
    });
    awaitLine();
    check("a delete just after the only seed thawed", () -> {
      expect(fs.delete(path, false), "not deleted");
      expect(!fs.exists(path), "still there");
      return "";
    });
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println(
          "usage: ContractCheck contract|read-across-kill|write-across-kill|read-after-seek"
              + "|frozen-seed|thawed-seed PATH");
      System.exit(2);
    }
    Configuration conf = new Configuration(false);
    String[] keys = {
      "fs.sr3.ring",
      Sr3Client.CONF_TOKEN,
      Sr3Client.CONF_CREDENTIAL,
      "fs.sr3.secret",
      "fs.sr3.seeds.shuffle",
      Tls.CONF_CA,
      Tls.CONF_CERT,
      Tls.CONF_KEY,
      Tls.CONF_KEY_FORMER,
      "fs.sr3.retries",
      Sr3Client.CONF_TIMEOUT_MS,
      Sr3Client.CONF_CONNECT_TIMEOUT_MS
    };
    for (String key : keys) {
      String value = System.getProperty(key);
      if (value != null) {
        conf.set(key, value);
      }
    }
    conf.set("fs.sr3.impl", Sr3FileSystem.class.getName());
    conf.set("fs.AbstractFileSystem.sr3.impl", Sr3Fs.class.getName());
    conf.setBoolean("fs.sr3.impl.disable.cache", true);
    ContractCheck checker = new ContractCheck(conf);
    switch (args[0]) {
      case "contract" -> checker.contract(args[1]);
      case "read-across-kill" -> checker.readAcrossKill(args[1]);
      case "write-across-kill" -> checker.writeAcrossKill(args[1]);
      case "read-after-seek" -> checker.readAfterSeek(args[1]);
      case "frozen-seed" -> checker.frozenSeed(args[1]);
      case "thawed-seed" -> checker.thawedSeed(args[1]);
      default -> {
        System.err.println("unknown mode " + args[0]);
        System.exit(2);
      }
    }
    checker.fs.close();
    System.exit(checker.failures.isEmpty() ? 0 : 1);
  }
}
