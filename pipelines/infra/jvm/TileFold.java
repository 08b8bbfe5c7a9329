package shopstream;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A micro-batch's tiles folded from its role rows in one pass over each partition, in place
 * of Spark's aggregation (features/tiles.py, keyed_tiles; pipelines/streaming/tile_fold.py
 * calls this).
 *
 * <p>Why it exists: the aggregation was the largest part of the online path's JVM time (stop
 * 88's profile, docs/streaming-performance.md: its 16 buffer updates per role row, its
 * fallback sort after 128 keys, reading the sorted rows back, and the higher-order functions
 * that turn its lists into category weights and last items). Reordering or regrouping it did
 * not help: it costs what its aggregates cost. Here each role row updates one tile held in a
 * hash map: counts and sums added, an item put in a set, a category's weight added, a last
 * item put in its place in a list of at most n, the latest values compared. Nothing is
 * sorted but the finished lists.
 *
 * <p>The rows are those of keyed_tiles for the same events (its columns, KEYED_TILE_COLUMNS,
 * and its rules: Spark's max_by of a struct (time, value) for the latest values, equal times
 * to the greater value; collect_set; the n most recent distinct items, ties by item id; the
 * summed weight per category). Unordered parts come sorted: items by id, categories by id.
 * A sum of doubles is added in the partition's row order, where Spark's may add partial sums
 * in another: the last bits of spend can differ, as they do between two Spark plans.
 * Input: the role rows of features.tiles.role_rows, hash-partitioned by (kind, key), so each
 * tile is whole in one partition and keeps that partitioning.
 */
public final class TileFold implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
  private static final long serialVersionUID = 1L;

  private static final String[] INPUT = {
      "event_time", "item_id", "category_id", "region", "price", "quantity", "_event",
      "_weight", "kind", "key", "_role"};
  private static final DataType[] INPUT_TYPES = {
      DataTypes.TimestampType, DataTypes.StringType, DataTypes.StringType,
      DataTypes.StringType, DataTypes.DoubleType, DataTypes.IntegerType,
      DataTypes.IntegerType, DataTypes.DoubleType, DataTypes.StringType,
      DataTypes.StringType, DataTypes.IntegerType};
  private static final int TIME = 0, ITEM = 1, CATEGORY = 2, REGION = 3, PRICE = 4,
      QUANTITY = 5, EVENT = 6, WEIGHT = 7, KIND = 8, KEY = 9, ROLE = 10;

  /** keyed_tiles' columns and types (features/tiles.py, KEYED_TILE_COLUMNS). */
  public static final StructType SCHEMA = new StructType(new StructField[] {
      field("kind", DataTypes.StringType), field("key", DataTypes.StringType),
      field("tile_start", DataTypes.LongType), field("views", DataTypes.LongType),
      field("carts", DataTypes.LongType), field("purchases", DataTypes.LongType),
      field("spend", DataTypes.DoubleType), field("units", DataTypes.LongType),
      field("items_viewed", DataTypes.createArrayType(DataTypes.StringType, true)),
      field("category_weights", DataTypes.createArrayType(new StructType(new StructField[] {
          field("category_id", DataTypes.StringType), field("weight", DataTypes.DoubleType)}),
          false)),
      field("last_viewed", DataTypes.createArrayType(entryType(), true)),
      field("last_purchased", DataTypes.createArrayType(entryType(), true)),
      field("category_id", DataTypes.StringType), field("item_id", DataTypes.StringType),
      field("region", DataTypes.StringType), field("price", DataTypes.DoubleType),
      field("max_us", DataTypes.LongType), field("price_us", DataTypes.LongType)});

  private final int[] at;
  private final long slideMicros;
  private final int lastItemsN;
  private final int view, cart, purchase;
  private final int userRole, itemRole, salesRole;

  private TileFold(int[] at, long slideMicros, int lastItemsN, int view, int cart, int purchase,
                   int userRole, int itemRole, int salesRole) {
    this.at = at;
    this.slideMicros = slideMicros;
    this.lastItemsN = lastItemsN;
    this.view = view;
    this.cart = cart;
    this.purchase = purchase;
    this.userRole = userRole;
    this.itemRole = itemRole;
    this.salesRole = salesRole;
  }

  private static StructField field(String name, DataType type) {
    return new StructField(name, type, true, Metadata.empty());
  }

  private static StructType entryType() {
    return new StructType(new StructField[] {
        field("event_us", DataTypes.LongType), field("item_id", DataTypes.StringType)});
  }

  /**
   * The tiles of {@code roles} (role rows: {@link #INPUT}'s columns, each tile's rows in one
   * partition), one row per (kind, key, tile_start) in {@link #SCHEMA}, partition by
   * partition. The codes are those the role rows carry: the event type's ({@code _event})
   * for a view, a cart and a purchase, and the role's ({@code _role}) for each kind.
   */
  public static Dataset<Row> apply(Dataset<Row> roles, long slideSeconds, int lastItemsN,
                                   int view, int cart, int purchase, int userRole,
                                   int itemRole, int salesRole) {
    if (slideSeconds < 1) {
      throw new IllegalArgumentException("slideSeconds must be >= 1, not " + slideSeconds);
    }
    StructType schema = roles.schema();
    int[] at = new int[INPUT.length];
    for (int i = 0; i < INPUT.length; i++) {
      at[i] = schema.fieldIndex(INPUT[i]);
      DataType type = schema.apply(INPUT[i]).dataType();
      if (!type.equals(INPUT_TYPES[i])) {
        throw new IllegalArgumentException("TileFold: column " + INPUT[i] + " is "
            + type.simpleString() + ", not " + INPUT_TYPES[i].simpleString());
      }
    }
    TileFold fold = new TileFold(at, slideSeconds * 1_000_000L, lastItemsN, view, cart,
        purchase, userRole, itemRole, salesRole);
    RDD<InternalRow> folded = roles.queryExecution().toRdd().toJavaRDD()
        .mapPartitions(fold, true).rdd();
    SparkSession spark = roles.sparkSession();
    return spark.internalCreateDataFrame(folded, SCHEMA, false);
  }

  /** One tile's key: the role (a number per kind), the entity's key and the tile's start. */
  private static final class TileKey {
    final int role;
    final UTF8String key;
    final long tileStart;
    final int hash;

    TileKey(int role, UTF8String key, long tileStart) {
      this.role = role;
      this.key = key;
      this.tileStart = tileStart;
      this.hash = (key.hashCode() * 31 + Long.hashCode(tileStart)) * 31 + role;
    }

    @Override
    public int hashCode() {
      return hash;
    }

    @Override
    public boolean equals(Object other) {
      if (!(other instanceof TileKey)) {
        return false;
      }
      TileKey that = (TileKey) other;
      return hash == that.hash && role == that.role && tileStart == that.tileStart
          && key.equals(that.key);
    }
  }

  /** What a tile holds while its rows are folded. */
  private static final class Tile {
    final UTF8String kind;
    final UTF8String key;
    final long tileStart;
    final boolean user;
    long views, carts, purchases, units;
    double spend;
    long maxUs = Long.MIN_VALUE;
    // non-user rows: the latest event's values (a struct (time, value) per max_by)
    boolean hasLatest;
    long latestUs;
    UTF8String category, region, item;
    boolean priced;
    long priceUs;
    double price;
    // user rows
    HashSet<UTF8String> items;
    List<UTF8String> categories;
    double[] weights;
    List<Object[]> viewed, bought;  // {Long event_us, UTF8String item}, latest first

    Tile(UTF8String kind, UTF8String key, long tileStart, boolean user) {
      this.kind = kind;
      this.key = key;
      this.tileStart = tileStart;
      this.user = user;
    }
  }

  @Override
  public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
    Map<TileKey, Tile> tiles = new LinkedHashMap<>();
    while (rows.hasNext()) {
      add(tiles, rows.next());
    }
    List<InternalRow> out = new ArrayList<>(tiles.size());
    for (Tile tile : tiles.values()) {
      out.add(finished(tile));
    }
    return out.iterator();
  }

  private void add(Map<TileKey, Tile> tiles, InternalRow row) {
    long us = row.getLong(at[TIME]);
    long tileStart = (us - Math.floorMod(us, slideMicros)) / 1_000_000L;
    int role = row.getInt(at[ROLE]);
    UTF8String key = row.getUTF8String(at[KEY]);
    Tile tile = tiles.get(new TileKey(role, key, tileStart));
    if (tile == null) {
      UTF8String owned = key.copy();  // the row's bytes are reused for the next row
      tile = new Tile(row.getUTF8String(at[KIND]).copy(), owned, tileStart, role == userRole);
      tiles.put(new TileKey(role, owned, tileStart), tile);
    }
    int event = row.getInt(at[EVENT]);
    boolean bought = event == purchase;
    boolean hasPrice = !row.isNullAt(at[PRICE]);
    if (event == view) {
      tile.views++;
    } else if (event == cart) {
      tile.carts++;
    } else if (bought) {
      tile.purchases++;
    }
    if (bought && !row.isNullAt(at[QUANTITY])) {
      int quantity = row.getInt(at[QUANTITY]);
      tile.units += quantity;
      if (hasPrice) {
        tile.spend += row.getDouble(at[PRICE]) * (double) quantity;
      }
    }
    if (us > tile.maxUs) {
      tile.maxUs = us;
    }
    if (role == userRole) {
      addUser(tile, row, us, event);
      return;
    }
    UTF8String category = nullable(row, at[CATEGORY]);
    UTF8String region = nullable(row, at[REGION]);
    UTF8String item = role == salesRole ? nullable(row, at[ITEM]) : null;
    if (!tile.hasLatest || us > tile.latestUs) {
      tile.hasLatest = true;
      tile.latestUs = us;
      tile.category = owned(category);
      tile.region = owned(region);
      tile.item = owned(item);
    } else if (us == tile.latestUs) {  // equal times: the greater value, as max_by's struct
      tile.category = greater(tile.category, category);
      tile.region = greater(tile.region, region);
      tile.item = greater(tile.item, item);
    }
    if (role == itemRole && hasPrice) {
      double price = row.getDouble(at[PRICE]);
      if (!tile.priced || us > tile.priceUs
          || (us == tile.priceUs && Double.compare(price, tile.price) > 0)) {
        tile.priced = true;
        tile.priceUs = us;
        tile.price = price;
      }
    }
  }

  private void addUser(Tile tile, InternalRow row, long us, int event) {
    UTF8String item = nullable(row, at[ITEM]);
    if (event == view && item != null) {
      if (tile.items == null) {
        tile.items = new HashSet<>();
      }
      if (!tile.items.contains(item)) {
        tile.items.add(item.copy());
      }
    }
    addWeight(tile, nullable(row, at[CATEGORY]),
        row.isNullAt(at[WEIGHT]) ? null : row.getDouble(at[WEIGHT]));
    if (lastItemsN > 0 && item != null) {
      if (event == view) {
        tile.viewed = withEntry(tile.viewed, us, item);
      } else if (event == purchase) {
        tile.bought = withEntry(tile.bought, us, item);
      }
    }
  }

  /** A category's weight added to its sum; a null weight adds nothing, as the
   *  aggregate's sum skips it. A null category, which sum_category_weights' filter
   *  never matches, keeps an entry of weight 0. */
  private static void addWeight(Tile tile, UTF8String category, Double weight) {
    if (tile.categories == null) {
      tile.categories = new ArrayList<>(4);
      tile.weights = new double[4];
    }
    List<UTF8String> categories = tile.categories;
    int i = 0;
    while (i < categories.size() && !java.util.Objects.equals(categories.get(i), category)) {
      i++;
    }
    if (i == categories.size()) {
      categories.add(category == null ? null : category.copy());
      if (i == tile.weights.length) {
        tile.weights = Arrays.copyOf(tile.weights, i * 2);
      }
      tile.weights[i] = 0.0;
    }
    if (category != null && weight != null) {
      tile.weights[i] += weight;
    }
  }

  /** latest_distinct_items' list with one more entry: latest first, equal times by item
   *  id, one entry per item (its latest), at most n. */
  private List<Object[]> withEntry(List<Object[]> entries, long us, UTF8String item) {
    if (entries == null) {
      entries = new ArrayList<>(Math.min(lastItemsN, 8) + 1);
    }
    for (int i = 0; i < entries.size(); i++) {
      Object[] entry = entries.get(i);
      if (entry[1].equals(item)) {
        if ((Long) entry[0] >= us) {
          return entries;
        }
        entries.remove(i);
        break;
      }
    }
    int place = 0;
    while (place < entries.size() && !after(us, item, entries.get(place))) {
      place++;
    }
    if (place < lastItemsN) {
      entries.add(place, new Object[] {us, item.copy()});
      if (entries.size() > lastItemsN) {
        entries.remove(entries.size() - 1);
      }
    }
    return entries;
  }

  /** Whether (us, item) goes before {@code entry}: later, or as late with a smaller id. */
  private static boolean after(long us, UTF8String item, Object[] entry) {
    long other = (Long) entry[0];
    return us > other || (us == other && item.compareTo((UTF8String) entry[1]) < 0);
  }

  private static UTF8String nullable(InternalRow row, int ordinal) {
    return row.isNullAt(ordinal) ? null : row.getUTF8String(ordinal);
  }

  private static UTF8String owned(UTF8String value) {
    return value == null ? null : value.copy();
  }

  /** The greater of two values, a null the least (a struct's field order). */
  private static UTF8String greater(UTF8String held, UTF8String value) {
    if (value == null || (held != null && held.compareTo(value) >= 0)) {
      return held;
    }
    return value.copy();
  }

  private InternalRow finished(Tile tile) {
    Object[] values = new Object[SCHEMA.size()];
    values[0] = tile.kind;
    values[1] = tile.key;
    values[2] = tile.tileStart;
    values[3] = tile.views;
    values[4] = tile.carts;
    values[5] = tile.purchases;
    values[6] = tile.spend;
    values[7] = tile.units;
    values[8] = new GenericArrayData(sortedItems(tile));
    values[9] = new GenericArrayData(weights(tile));
    values[10] = new GenericArrayData(entries(tile.viewed));
    values[11] = new GenericArrayData(entries(tile.bought));
    if (!tile.user && tile.hasLatest) {
      values[12] = tile.category;
      values[13] = tile.item;
      values[14] = tile.region;
    }
    if (tile.priced) {
      values[15] = tile.price;
      values[17] = tile.priceUs;
    }
    values[16] = tile.maxUs;
    return new GenericInternalRow(values);
  }

  private static Object[] sortedItems(Tile tile) {
    if (tile.items == null) {
      return new Object[0];
    }
    List<UTF8String> items = new ArrayList<>(tile.items);
    Collections.sort(items);
    return items.toArray();
  }

  private static Object[] weights(Tile tile) {
    if (tile.categories == null) {
      return new Object[0];
    }
    int n = tile.categories.size();
    Integer[] order = new Integer[n];
    for (int i = 0; i < n; i++) {
      order[i] = i;
    }
    List<UTF8String> categories = tile.categories;
    Arrays.sort(order, (a, b) -> {
      UTF8String x = categories.get(a), y = categories.get(b);
      if (x == null || y == null) {
        return x == null ? (y == null ? 0 : -1) : 1;
      }
      return x.compareTo(y);
    });
    Object[] out = new Object[n];
    for (int i = 0; i < n; i++) {
      out[i] = new GenericInternalRow(new Object[] {categories.get(order[i]),
          tile.weights[order[i]]});
    }
    return out;
  }

  private static Object[] entries(List<Object[]> entries) {
    if (entries == null) {
      return new Object[0];
    }
    Object[] out = new Object[entries.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = new GenericInternalRow(entries.get(i));
    }
    return out;
  }
}
