package shopstream;

import java.time.ZoneOffset;
import java.util.HashMap;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;

/**
 * The event contract's fields of one JSON record, read in one pass: shopstream's
 * validation (features/validation.py) applies its rules to what this returns.
 *
 * <p>Why it exists: Spark's own way to the same values, try_variant_get of each field
 * to a string or a number, builds a Literal and a Cast expression for every value and
 * reads a fresh SQLConf on the executor to do it; that was over a third of the
 * validation's CPU. This parses with Spark's own parser (VariantBuilder.parseJson,
 * with the session's duplicate-key and Unicode settings, as try_parse_json does), so
 * what counts as valid JSON, and each value's type, are Spark's; it then reads the
 * fields with the Variant API directly.
 *
 * <p>Returns a row of {@code json} (false: not valid JSON) and, per field name given to
 * the constructor, {@code type} (null: absent; VOID, STRING, NUMBER or OTHER),
 * {@code text} (a string's value; the JSON text of any other non-null value when the
 * field asks for text, as a cast of the value to a string gives) and {@code number}
 * (a number's value as a double, when the field asks for one). A document that is not
 * an object has no fields.
 */
public final class ContractFields implements UDF1<String, Row> {
  private static final long serialVersionUID = 1L;

  private final String[] names;
  private final boolean[] wantsText;
  private final boolean[] wantsNumber;
  private transient HashMap<String, Integer> index;
  private transient boolean allowDuplicateKeys;
  private transient boolean validateUnicode;

  public ContractFields(String[] names, boolean[] wantsText, boolean[] wantsNumber) {
    if (names.length != wantsText.length || names.length != wantsNumber.length) {
      throw new IllegalArgumentException("one text and one number flag per field name");
    }
    this.names = names.clone();
    this.wantsText = wantsText.clone();
    this.wantsNumber = wantsNumber.clone();
  }

  /** On the executor, once per deserialized instance (a task): the lookup and the settings. */
  private void setUp() {
    HashMap<String, Integer> map = new HashMap<>();
    for (int i = 0; i < names.length; i++) {
      map.put(names[i], i);
    }
    SQLConf conf = SQLConf.get();
    allowDuplicateKeys = Boolean.parseBoolean(
        conf.getConfString("spark.sql.variant.allowDuplicateKeys", "false"));
    validateUnicode = Boolean.parseBoolean(
        conf.getConfString("spark.sql.variant.validateUnicodeInJsonParsing", "true"));
    index = map;
  }

  @Override
  public Row call(String text) {
    if (text == null) {
      return null;
    }
    if (index == null) {
      setUp();
    }
    Object[] out = new Object[1 + 3 * names.length];
    Variant doc;
    try {
      doc = VariantBuilder.parseJson(text, allowDuplicateKeys, validateUnicode);
    } catch (Exception e) {  // malformed, a duplicate key, too large: try_parse_json's null
      out[0] = Boolean.FALSE;
      return RowFactory.create(out);
    }
    out[0] = Boolean.TRUE;
    if (doc.getType() != org.apache.spark.types.variant.VariantUtil.Type.OBJECT) {
      return RowFactory.create(out);
    }
    int size = doc.objectSize();
    for (int i = 0; i < size; i++) {
      Variant.ObjectField field = doc.getFieldAtIndex(i);
      Integer at = index.get(field.key);
      if (at != null) {
        read(field.value, at, out);
      }
    }
    return RowFactory.create(out);
  }

  private void read(Variant value, int at, Object[] out) {
    int base = 1 + 3 * at;
    switch (value.getType()) {
      case NULL:
        out[base] = "VOID";
        return;
      case STRING:
        out[base] = "STRING";
        out[base + 1] = value.getString();
        return;
      case LONG:
        number(at, out, (double) value.getLong());
        break;
      case DECIMAL:
        number(at, out, value.getDecimal().doubleValue());
        break;
      case DOUBLE:
        number(at, out, value.getDouble());
        break;
      case FLOAT:
        number(at, out, (double) value.getFloat());
        break;
      default:
        out[base] = "OTHER";
    }
    if (wantsText[at]) {
      out[base + 1] = value.toJson(ZoneOffset.UTC);
    }
  }

  private void number(int at, Object[] out, double number) {
    int base = 1 + 3 * at;
    out[base] = "NUMBER";
    if (wantsNumber[at]) {
      out[base + 2] = number;
    }
  }
}
