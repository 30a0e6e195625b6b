package sr3.hadoop;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.HashPartitioner;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.api.java.function.PairFlatMapFunction;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning;
import org.apache.spark.sql.execution.datasources.v2.state.metadata.StateMetadataPartitionReader;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetMap;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeq;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqBase;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadataV2;
import org.apache.spark.sql.execution.streaming.runtime.StreamingQueryCheckpointMetadata;
import org.apache.spark.sql.execution.streaming.operators.stateful.StatePartitionKeyExtractorFactory$;
import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.OperatorStateMetadata;
import org.apache.spark.sql.execution.streaming.state.PrefixKeyScanStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StatePartitionKeyExtractor;
import org.apache.spark.sql.execution.streaming.state.StateSchemaCompatibilityChecker;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreColFamilySchema;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf$;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetadata;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider$;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;

import scala.Option;
import scala.Tuple2;

/**
 * The state of a stopped query kept by the HDFS-backed state store provider, spread over
 * another number of partitions: what Spark's offline runner
 * ({@code StreamingCheckpointManager.repartition}) does for RocksDB's provider and refuses
 * for this one.
 *
 * <p>As Spark's runner does, it reads every store of every stateful operator as of a batch
 * through the provider itself, places each row by the operator's partition key
 * (Spark's {@code StatePartitionKeyExtractorFactory}, hashed as the operator's shuffle
 * hashes it), and writes each new partition's rows through the provider, into a fresh
 * store under {@code scratch}, committed with a snapshot; the snapshot is then moved into
 * the checkpoint as the partition's state at the rescaled batch. The provider reads a
 * version from its newest snapshot at or below it, so the old partitions' files below that
 * version are left as they are. The offset and commit log entries of the rescaled batch are
 * the caller's (sr3's {@code spark_connector.rescalable}).
 */
public final class HdfsStateRepartition {
    private static final String DEFAULT_FAMILY = "default";
    private static final String PARTITIONS = "spark.sql.shuffle.partitions";

    private HdfsStateRepartition() {}

    /**
     * Rescales the stopped query's {@code checkpoint} to {@code partitions} as Spark's runner
     * does: batch N+1 (N the newest committed batch) gets N's offsets with the new count,
     * then the state, then N's commit; a batch N+1 already at the new count and not
     * committed (a rescale that stopped half-way) is finished. Returns N+1.
     */
    public static long rescale(SparkSession spark, String checkpoint, int partitions,
            String scratch) throws IOException {
        Configuration hadoop = spark.sessionState().newHadoopConf();
        Path root = new Path(checkpoint);
        String resolved = root.getFileSystem(hadoop).makeQualified(root).toString();
        StreamingQueryCheckpointMetadata logs = new StreamingQueryCheckpointMetadata(
                spark, resolved, StreamingQueryCheckpointMetadata.$lessinit$greater$default$3());
        long committed = (Long) logs.commitLog().getLatestBatchId().get();
        long last = (Long) logs.offsetLog().getLatestBatchId().get();
        OffsetSeqBase base = logs.offsetLog().get(committed).get();
        int oldPartitions = partitionsOf(base);
        long next = committed + 1;
        if (last == committed) {
            if (oldPartitions == partitions) {
                throw new IllegalArgumentException(
                        checkpoint + " has " + partitions + " state partitions already");
            }
            if (!logs.offsetLog().add(next, withPartitions(base, partitions))) {
                throw new IllegalStateException("offsets/" + next + " was written meanwhile");
            }
        } else if (last != next || partitionsOf(logs.offsetLog().get(last).get()) != partitions
                || oldPartitions == partitions) {
            throw new IllegalStateException("batch " + last + " of " + checkpoint
                    + " was planned and is not committed: finish it first");
        }
        Map<String, String> conf =
                scala.jdk.javaapi.CollectionConverters.asJava(base.metadataOpt().get().conf());
        run(spark, resolved, committed, next, oldPartitions, partitions, conf, scratch);
        if (!logs.commitLog().add(next, logs.commitLog().get(committed).get())) {
            throw new IllegalStateException("commits/" + next + " was written meanwhile");
        }
        return next;
    }

    private static int partitionsOf(OffsetSeqBase offsets) {
        return Integer.parseInt(offsets.metadataOpt().get().conf().get(PARTITIONS).get());
    }

    private static OffsetSeqBase withPartitions(OffsetSeqBase offsets, int partitions) {
        String count = Integer.toString(partitions);
        if (offsets instanceof OffsetSeq v1) {
            OffsetSeqMetadata metadata = v1.metadataOpt().get();
            return v1.copy(v1.offsets(), Option.apply(metadata.copy(
                    metadata.batchWatermarkMs(), metadata.batchTimestampMs(),
                    metadata.conf().updated(PARTITIONS, count))));
        }
        if (offsets instanceof OffsetMap v2) {
            OffsetSeqMetadataV2 metadata = v2.metadata();
            return v2.copy(v2.offsetsMap(), metadata.copy(
                    metadata.batchWatermarkMs(), metadata.batchTimestampMs(),
                    metadata.conf().updated(PARTITIONS, count), metadata.sourceMetadataInfo(),
                    metadata.controlBatchInfo()));
        }
        throw new IllegalStateException("an offset log entry of an unknown version: " + offsets);
    }

    /**
     * Writes the state of {@code checkpoint} as of batch {@code readBatch} (at {@code
     * oldPartitions} partitions) as the state of batch {@code writeBatch} at {@code
     * partitions}; {@code offsetConf}: the settings of the batch's offset log entry (the
     * state store's among them); {@code scratch}: a folder on the checkpoint's file system for
     * the new stores before they are moved in. Returns the rows written.
     */
    static long run(
            SparkSession spark,
            String checkpoint,
            long readBatch,
            long writeBatch,
            int oldPartitions,
            int partitions,
            Map<String, String> offsetConf,
            String scratch)
            throws IOException {
        Configuration hadoop = spark.sessionState().newHadoopConf();
        Path root = new Path(checkpoint);
        String resolved = root.getFileSystem(hadoop).makeQualified(root).toString();
        SQLConf conf = spark.sessionState().conf().clone();
        for (Map.Entry<String, String> setting : offsetConf.entrySet()) {
            conf.setConfString(setting.getKey(), setting.getValue());
        }
        StateStoreConf storeConf = StateStoreConf$.MODULE$.apply(conf);
        String joinFormat = offsetConf.get("spark.sql.streaming.join.stateFormatVersion");
        SerializableConfiguration serializable = new SerializableConfiguration(hadoop);
        OperatorStateMetadata[] operators =
                new StateMetadataPartitionReader(resolved, serializable, readBatch)
                        .allOperatorStateMetadata();
        JavaSparkContext context = JavaSparkContext.fromSparkContext(spark.sparkContext());
        List<Integer> old = new ArrayList<>();
        for (int partition = 0; partition < oldPartitions; partition++) {
            old.add(partition);
        }
        long rows = 0;
        for (OperatorStateMetadata operator : operators) {
            scala.collection.Iterator<StateStoreMetadata> stores =
                    operator.stateStoresMetadata().iterator();
            while (stores.hasNext()) {
                Store store = Store.of(
                        resolved, new Path(scratch).toString(), operator, stores.next(), hadoop,
                        storeConf, serializable, joinFormat, readBatch + 1, writeBatch + 1,
                        partitions);
                rows += context.parallelize(old, oldPartitions)
                        .flatMapToPair(new ReadPartition(store))
                        .partitionBy(new HashPartitioner(partitions))
                        .mapPartitionsWithIndex(new WritePartition(store), true)
                        .collect().stream().mapToLong(Long::longValue).sum();
            }
        }
        return rows;
    }

    /** One state store of an operator, as the executors need it. */
    static final class Store implements Serializable {
        private static final long serialVersionUID = 1L;

        final String stateRoot;
        final String scratchRoot;
        final long operatorId;
        final String operatorName;
        final String storeName;
        final StructType keySchema;
        final StructType valueSchema;
        final KeyStateEncoderSpec encoder;
        final StateStoreConf storeConf;
        final SerializableConfiguration hadoop;
        final Integer joinFormat;
        final long readVersion;
        final long writeVersion;
        final int partitions;

        private Store(String stateRoot, String scratchRoot, long operatorId, String operatorName,
                String storeName, StructType keySchema, StructType valueSchema,
                KeyStateEncoderSpec encoder, StateStoreConf storeConf,
                SerializableConfiguration hadoop, Integer joinFormat, long readVersion,
                long writeVersion, int partitions) {
            this.stateRoot = stateRoot;
            this.scratchRoot = scratchRoot;
            this.operatorId = operatorId;
            this.operatorName = operatorName;
            this.storeName = storeName;
            this.keySchema = keySchema;
            this.valueSchema = valueSchema;
            this.encoder = encoder;
            this.storeConf = storeConf;
            this.hadoop = hadoop;
            this.joinFormat = joinFormat;
            this.readVersion = readVersion;
            this.writeVersion = writeVersion;
            this.partitions = partitions;
        }

        /** The store's schema as its operator wrote it (the schema file Spark reads). */
        static Store of(String checkpoint, String scratch, OperatorStateMetadata operator,
                StateStoreMetadata metadata, Configuration hadoop, StateStoreConf storeConf,
                SerializableConfiguration serializable, String joinFormat, long readVersion,
                long writeVersion, int partitions) {
            String stateRoot = new Path(checkpoint, "state").toString();
            long operatorId = operator.operatorInfo().operatorId();
            StateStoreId id = new StateStoreId(
                    stateRoot, operatorId, StateStore.PARTITION_ID_TO_CHECK_SCHEMA(),
                    metadata.storeName());
            List<StateStoreColFamilySchema> schemas = scala.jdk.javaapi.CollectionConverters.asJava(
                    new StateSchemaCompatibilityChecker(
                            new StateStoreProviderId(id, UUID.randomUUID()), hadoop,
                            scala.collection.immutable.List$.MODULE$.empty(), Option.empty(),
                            false)
                            .readSchemaFile());
            StateStoreColFamilySchema schema = null;
            for (StateStoreColFamilySchema candidate : schemas) {
                if (DEFAULT_FAMILY.equals(candidate.colFamilyName())) {
                    schema = candidate;
                }
            }
            if (schema == null) {
                throw new IllegalStateException(
                        "no schema of the default column family for operator " + operatorId
                                + " store " + metadata.storeName());
            }
            KeyStateEncoderSpec encoder = schema.keyStateEncoderSpec().isDefined()
                    ? schema.keyStateEncoderSpec().get()
                    : metadata.numColsPrefixKey() > 0
                            ? new PrefixKeyScanStateEncoderSpec(
                                    schema.keySchema(), metadata.numColsPrefixKey())
                            : new NoPrefixKeyStateEncoderSpec(schema.keySchema());
            return new Store(
                    stateRoot, new Path(scratch, "state").toString(), operatorId,
                    operator.operatorInfo().operatorName(), metadata.storeName(),
                    schema.keySchema(), schema.valueSchema(), encoder, storeConf, serializable,
                    joinFormat == null ? null : Integer.valueOf(joinFormat), readVersion,
                    writeVersion, partitions);
        }

        StateStoreId id(String root, int partition) {
            return new StateStoreId(root, operatorId, partition, storeName);
        }

        StateStoreProvider provider(String root, int partition) {
            return StateStoreProvider$.MODULE$.createAndInit(
                    new StateStoreProviderId(id(root, partition), UUID.randomUUID()),
                    keySchema, valueSchema, encoder, false, storeConf, hadoop.value(), false,
                    Option.empty());
        }

        StatePartitionKeyExtractor extractor() {
            Option<Object> format =
                    joinFormat == null ? Option.empty() : Option.apply((Object) joinFormat);
            return StatePartitionKeyExtractorFactory$.MODULE$.create(
                    operatorName, keySchema, storeName, DEFAULT_FAMILY, format, Option.empty());
        }
    }

    /** An old partition's rows, each with the new partition its key belongs to. */
    static final class ReadPartition
            implements PairFlatMapFunction<Integer, Integer, Tuple2<byte[], byte[]>> {
        private static final long serialVersionUID = 1L;
        private final Store store;

        ReadPartition(Store store) {
            this.store = store;
        }

        @Override
        public Iterator<Tuple2<Integer, Tuple2<byte[], byte[]>>> call(Integer partition) {
            StatePartitionKeyExtractor extractor = store.extractor();
            // The shuffle's own partition function: Pmod(Murmur3Hash(key, 42), partitions).
            Expression placement = new HashPartitioning(
                    scala.jdk.javaapi.CollectionConverters.asScala(List.<Expression>of(
                            new BoundReference(0, extractor.partitionKeySchema(), false)))
                            .toList(),
                    store.partitions).partitionIdExpression();
            StateStoreProvider provider = store.provider(store.stateRoot, partition);
            ReadStateStore read;
            try {
                read = provider.getReadStore(store.readVersion, Option.empty());
            } catch (RuntimeException e) {
                provider.close();
                throw e;
            }
            scala.collection.Iterator<UnsafeRowPair> pairs = read.iterator(DEFAULT_FAMILY);
            // Row by row (the provider holds the partition's map already), closed at its end.
            return new Iterator<>() {
                private boolean open = true;

                @Override
                public boolean hasNext() {
                    if (open && !pairs.hasNext()) {
                        open = false;
                        read.abort();
                        provider.close();
                    }
                    return open;
                }

                @Override
                public Tuple2<Integer, Tuple2<byte[], byte[]>> next() {
                    if (!hasNext()) {
                        throw new java.util.NoSuchElementException();
                    }
                    UnsafeRowPair pair = pairs.next();
                    UnsafeRow key = extractor.partitionKey(pair.key());
                    int target = (Integer) placement.eval(new GenericInternalRow(new Object[] {key}));
                    return new Tuple2<>(target,
                            new Tuple2<>(pair.key().getBytes(), pair.value().getBytes()));
                }
            };
        }
    }

    /** A new partition's rows written as a snapshot, moved into the checkpoint. */
    static final class WritePartition implements
            Function2<Integer, Iterator<Tuple2<Integer, Tuple2<byte[], byte[]>>>, Iterator<Long>> {
        private static final long serialVersionUID = 1L;
        private final Store store;

        WritePartition(Store store) {
            this.store = store;
        }

        @Override
        public Iterator<Long> call(
                Integer partition, Iterator<Tuple2<Integer, Tuple2<byte[], byte[]>>> rows)
                throws IOException {
            long written = 0;
            Configuration hadoop = store.hadoop.value();
            Path scratch = store.id(store.scratchRoot, partition).storeCheckpointLocation();
            FileSystem fs = scratch.getFileSystem(hadoop);
            fs.delete(scratch, true); // a retried task starts from an empty store
            StateStoreProvider provider = store.provider(store.scratchRoot, partition);
            try {
                StateStore write = provider.getStore(0L, Option.empty(), true, false);
                while (rows.hasNext()) {
                    Tuple2<byte[], byte[]> row = rows.next()._2();
                    UnsafeRow key = new UnsafeRow(store.keySchema.length());
                    key.pointTo(row._1(), row._1().length);
                    UnsafeRow value = new UnsafeRow(store.valueSchema.length());
                    value.pointTo(row._2(), row._2().length);
                    write.put(key, value, DEFAULT_FAMILY);
                    written++;
                }
                write.commit();
            } finally {
                provider.close();
            }
            Path target = store.id(store.stateRoot, partition).storeCheckpointLocation();
            Path snapshot = new Path(target, store.writeVersion + ".snapshot");
            fs.mkdirs(target);
            fs.delete(snapshot, false); // a rescale redone to the same count
            if (!fs.rename(new Path(scratch, "1.snapshot"), snapshot)) {
                throw new IOException("cannot move the new state of partition " + partition
                        + " to " + snapshot);
            }
            fs.delete(scratch, true);
            return List.of(written).iterator();
        }
    }
}
