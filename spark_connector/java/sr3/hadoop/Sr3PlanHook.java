package sr3.hadoop;

/**
 * What a driver does with a batch's plan before the batch runs: Spark has written the
 * offset log entry of batch {@code batchId} (which fixes the batch's input) and is about
 * to make it visible. The hook (Python's {@code StateSync}, through py4j) puts the plan on
 * the ring and returns; throwing refuses the batch, so Spark never runs a batch whose
 * plan the ring does not hold.
 */
public interface Sr3PlanHook {
  void planned(long batchId, byte[] offsets) throws Exception;
}
