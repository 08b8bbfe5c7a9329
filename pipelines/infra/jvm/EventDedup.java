package shopstream;

import java.util.NoSuchElementException;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;

/**
 * The stream's deduplication, with state that expires without being read whole
 * (pipelines/streaming/dedup.py builds its input; docs/streaming-performance.md,
 * "A dedup that expires by the bucket").
 *
 * <p>Why it exists: Spark's dropDuplicatesWithinWatermark keeps one state row per id and,
 * every micro-batch, reads all of them to find the expired ones. The state holds
 * rate x retention ids, so at full speed and the default retention each batch read tens
 * of millions of rows to expire one batch's worth. Here the ids are grouped by a bucket
 * of their event time and a shard of their id (the group column): an event's copy has
 * the same id and event time, so it lands in the same group. Each group keeps its ids in
 * a MapState and one processing-time timer, set to the batch's time + the retention
 * whenever a batch adds an id to the group. Spark keeps timers ordered by their time, so a batch
 * reads only the timers that are due, and a due group drops its ids with one prefix scan
 * of its own entries. An id is remembered at least the retention after the batch that
 * read it (longer while its group keeps receiving new ids: late events of an old bucket),
 * and is expired by the first batch at or after its group's time.
 *
 * <p>A group's ids are one ListState (dedup.py's layout {@code lists}): a batch reads the
 * group's list once into a hash set, filters its rows against it, and appends the new ids
 * with one call (RocksDB's merge). Why: as a MapState (the {@code bigint} and {@code string}
 * layouts, which checkpoints started before keep), every record was a containsKey and an
 * updateValue, a RocksDB get and put through JNI: over half of the read phase's CPU
 * (docs/streaming-performance.md, "The dedup's ids as lists"). A list is read
 * whole, so its groups are narrower in time (dedup.py's bucket per layout).
 *
 * <p>The group is a long (transformWithState sorts each batch by it, and a long sorts by
 * its prefix alone), or a string in checkpoints started before.
 * Rows whose group is negative, or starts with {@code k/}, are never duplicates (the
 * invalid records, keyed by their Kafka coordinates): they pass through without state.
 * The batch's time is Spark's (kept in the offset log), so a replayed batch sets the same
 * timers.
 */
public final class EventDedup<K> extends StatefulProcessor<K, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final int keyOrdinal;
  private final long retentionMs;
  private final boolean lists;
  /** A group's ids: one list ({@code lists}), or a map of id to true (the older layouts). */
  private transient ListState<String> ids;
  private transient MapState<String, Boolean> seen;
  private transient ValueState<Long> expiry;

  private EventDedup(int keyOrdinal, long retentionMs, boolean lists) {
    this.keyOrdinal = keyOrdinal;
    this.retentionMs = retentionMs;
    this.lists = lists;
  }

  /** {@code df} without the copies: rows grouped by {@code groupCol} (a long, or a string
   *  as older checkpoints hold), identified by {@code keyCol} (a string), each group's ids
   *  kept as one list ({@code lists}) or as a map (the older layouts); the result has
   *  {@code df}'s schema. */
  public static Dataset<Row> apply(Dataset<Row> df, String keyCol, String groupCol,
                                   long retentionMs, boolean lists) {
    StructType schema = df.schema();
    int key = schema.fieldIndex(keyCol);
    if (schema.apply(groupCol).dataType() instanceof StringType) {
      return df.groupBy(df.col(groupCol)).as(Encoders.STRING(), Encoders.row(schema))
          .transformWithState(new EventDedup<String>(key, retentionMs, lists),
              TimeMode.ProcessingTime(), OutputMode.Append(), Encoders.row(schema));
    }
    return df.groupBy(df.col(groupCol)).as(Encoders.LONG(), Encoders.row(schema))
        .transformWithState(new EventDedup<Long>(key, retentionMs, lists),
            TimeMode.ProcessingTime(), OutputMode.Append(), Encoders.row(schema));
  }

  private static boolean passesThrough(Object group) {
    return group instanceof Long ? (Long) group < 0 : ((String) group).startsWith("k/");
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    if (lists) {
      ids = getHandle().getListState("ids", Encoders.STRING(), TTLConfig.NONE());
    } else {
      seen = getHandle().getMapState("seen", Encoders.STRING(), Encoders.BOOLEAN(),
          TTLConfig.NONE());
    }
    expiry = getHandle().getValueState("expiry", Encoders.LONG(), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      K group, scala.collection.Iterator<Row> rows, TimerValues timers) {
    if (passesThrough(group)) {
      return rows;
    }
    final long at = timers.getCurrentProcessingTimeInMs() + retentionMs;
    // Spark 4.3 consumes this iterator with the group's key set (TransformWithStateExec's
    // iteratorWithImplicitKeySet), so the state is read and written as it goes
    java.util.Iterator<Row> fresh = new java.util.Iterator<Row>() {
      private Row next;
      private boolean armed;

      /** The group's timer at this batch's time + the retention, once per batch that
       *  adds an id: a batch of copies alone does not extend what it remembers. */
      private void arm() {
        armed = true;
        if (!expiry.exists()) {
          getHandle().registerTimer(at);
          expiry.update(at);
        } else if (expiry.get() != at) {
          getHandle().deleteTimer(expiry.get());
          getHandle().registerTimer(at);
          expiry.update(at);
        }
      }

      /** {@code lists}: the group's ids (read at the first row), and those this batch adds. */
      private java.util.HashSet<String> known;
      private java.util.ArrayList<String> added;

      private boolean isNew(String key) {
        if (!lists) {
          if (seen.containsKey(key)) {
            return false;
          }
          seen.updateValue(key, Boolean.TRUE);
          return true;
        }
        if (known == null) {
          known = new java.util.HashSet<>();
          added = new java.util.ArrayList<>();
          scala.collection.Iterator<String> stored = ids.get();
          while (stored.hasNext()) {
            known.add(stored.next());
          }
        }
        if (!known.add(key)) {
          return false;
        }
        added.add(key);
        return true;
      }

      @Override
      public boolean hasNext() {
        while (next == null && rows.hasNext()) {
          Row row = rows.next();
          String key = row.getString(keyOrdinal);
          if (isNew(key)) {
            if (!armed) {
              arm();
            }
            next = row;
          }
        }
        if (next == null && added != null && !added.isEmpty()) {
          // the group's rows are all read: its new ids in one append
          ids.appendList(added.toArray(new String[0]));
          added.clear();
        }
        return next != null;
      }

      @Override
      public Row next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        Row row = next;
        next = null;
        return row;
      }
    };
    return scala.jdk.javaapi.CollectionConverters.asScala(fresh);
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(
      K group, TimerValues timers, ExpiredTimerInfo info) {
    if (lists) {
      ids.clear();
    } else {
      seen.clear();
    }
    expiry.clear();
    return scala.collection.Iterator$.MODULE$.empty();
  }
}
