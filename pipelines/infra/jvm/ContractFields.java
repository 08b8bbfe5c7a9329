package shopstream;

import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.time.DateTimeException;
import java.time.LocalDateTime;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Locale;
import java.util.regex.Pattern;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.exc.InputCoercionException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.Literal$;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;
import org.apache.spark.unsafe.types.UTF8String;

import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;

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
 * <p>It takes the record's bytes, not its text, which must be valid UTF-8 (the validation
 * asks ValidUtf8 first and calls this only on the records that are). Spark handed the text
 * over as a Java String, decoded from the bytes for every record, which Jackson then read
 * char by char; on the bytes Jackson's UTF-8 parser reads them once, and its byte-level
 * key lookup is cheaper than its char-level one. Those two, the decoding and the char
 * parser, were about 4 % of the executors' samples in a profile of the stream's drain. A
 * record that takes the parseJson way below is decoded as Spark decoded it before (a
 * String of the bytes), so what it gives is unchanged.
 *
 * <p>{@link #fields} returns Spark's own row (register() makes it a session function) of
 * {@code json} (false: not valid JSON) and, per field name given to
 * the constructor, {@code type} (null: absent; VOID, STRING, NUMBER or OTHER),
 * {@code text} (a string's value; the JSON text of any other non-null value when the
 * field asks for text, as a cast of the value to a string gives) and {@code number}
 * (a number's value as a double, when the field asks for one). A document that is not
 * an object has no fields.
 *
 * <p>Most records are read without building the variant: one pass of a Jackson parser over
 * a flat object whose values are strings, numbers or nulls (readFlat). It applies what
 * VariantBuilder.buildJson would (the same parser settings, its Unicode check of every key
 * and string, its duplicate-key rule, its choice of long, decimal or double for a number),
 * so it reaches the same values; anything else (a nested value, a boolean, a number where
 * a text is wanted, a duplicate key, a parse error, a very long record) goes through
 * parseJson as before. Building the variant, with its key dictionary, its sort of the
 * fields and its copies, was a third of this function's samples in a profile of the drain.
 *
 * <p>The row's next to last field, {@code time}, is the event time's text as a timestamp, as
 * Spark's {@code when(text rlike iso, try_to_timestamp(text))} reads it (null for a text
 * that is not ISO-8601 or no time, and for a field that is not a string): see
 * {@link #isoTime}.
 *
 * <p>The row's last field, {@code rule}, is the number of the first of the contract's rules
 * that holds among those this evaluates on the values it read (null: none, or the document
 * is not an object). The rules come from features/validation.py (contract_rules), as JSON:
 * in order, each a check and its field, or null for one that Spark evaluates (the record's
 * bytes and text, the event time's, which read the time this gives, the Kafka key), which
 * keeps the numbers. Why here: as Spark expressions, the rules' flags were most of the
 * validation stage's generated method (about 11,800 of its 13,500 bytes of bytecode).
 * HotSpot's C2 refused that method, and its C1 could compile it only without profiling; in
 * some runs it stayed in the interpreter, at about three times the CPU. A loop over the
 * rules here is a small method each compiler takes.
 */
public final class ContractFields implements java.io.Serializable {
  private static final long serialVersionUID = 4L;

  /** The session function's name, which the query plans show for this object. */
  private String label = "ContractFields";

  private final String[] names;
  private final boolean[] wantsText;
  private final boolean[] wantsNumber;
  private transient HashMap<String, Integer> index;
  private transient boolean allowDuplicateKeys;
  private transient boolean validateUnicode;
  private transient JsonFactory factory;

  /** Longer records go through parseJson, which knows the variant's size limit (16 MiB). */
  private static final int FLAT_MAX_BYTES = 1 << 20;
  /** The precision and scale VariantBuilder keeps a JSON number as a decimal within. */
  private static final int MAX_DECIMAL_PRECISION = 38;

  private final boolean onePass;

  /**
   * The checks a rule may name, each the lower-case of its constant in the rule table of
   * features/validation.py (JAVA_CHECKS there lists the same); see {@link #holds}.
   */
  enum Check {
    MISSING, NOT_STRING, BLANK, TOO_LONG, UNKNOWN_EVENT_TYPE, NOT_STRING_OR_NUMBER, NOT_NUMBER,
    PRICE_OVERFLOW, NEGATIVE_PRICE, QUANTITY_OVERFLOW, INVALID_QUANTITY, MISSING_PRICE;

    /** The check of this name in the rule table; an error naming the rule if none is. */
    static Check named(String name, String rule) {
      for (Check check : values()) {
        if (check.name().toLowerCase(Locale.ROOT).equals(name)) {
          return check;
        }
      }
      throw new IllegalArgumentException("unknown check \"" + name + "\" in " + rule);
    }
  }

  /** Per rule, in order: its check (null: Spark's), its field's position, its limit. */
  private final Check[] ruleChecks;
  private final int[] ruleFields;
  private final int[] ruleLimits;
  private final int eventTypeField;
  private final UTF8String[] eventTypes;
  private final UTF8String[] pricedEventTypes;
  /** Per ASCII byte, whether it is one of the contract's whitespace characters. */
  private final boolean[] whitespace = new boolean[128];
  private final UTF8String whitespaceSet;
  private final double priceMax;
  private final double quantityMax;
  /** The field read as a time by {@link #isoTime} (-1: none), and the ISO pattern it uses. */
  private final int timeField;
  private final String isoPattern;
  private transient Pattern iso;
  /** The session's time zone: a text without an offset is a time there, as Spark's cast says. */
  private transient ZoneId sessionZone;

  /**
   * The type names, built once: Spark's row holds a string field as a UTF8String, which
   * would otherwise be encoded anew for every record (a UTF8String.fromString per field).
   */
  private static final UTF8String VOID = UTF8String.fromString("VOID");
  private static final UTF8String STRING = UTF8String.fromString("STRING");
  private static final UTF8String NUMBER = UTF8String.fromString("NUMBER");
  private static final UTF8String OTHER = UTF8String.fromString("OTHER");

  public ContractFields(String[] names, boolean[] wantsText, boolean[] wantsNumber,
      String rules) {
    this(names, wantsText, wantsNumber, rules, true);
  }

  /**
   * {@code rules} as features/validation.py writes them (see the class comment); with
   * {@code onePass} false every record goes through parseJson (the tests compare).
   */
  public ContractFields(String[] names, boolean[] wantsText, boolean[] wantsNumber,
      String rules, boolean onePass) {
    this.onePass = onePass;
    if (names.length != wantsText.length || names.length != wantsNumber.length) {
      throw new IllegalArgumentException("one text and one number flag per field name");
    }
    this.names = names.clone();
    this.wantsText = wantsText.clone();
    this.wantsNumber = wantsNumber.clone();
    JsonNode spec;
    try {
      spec = new ObjectMapper().readTree(rules);
    } catch (IOException e) {
      throw new IllegalArgumentException("the contract's rules are not JSON: " + e.getMessage(), e);
    }
    JsonNode list = spec.path("rules");
    int n = list.size();
    ruleChecks = new Check[n];
    ruleFields = new int[n];
    ruleLimits = new int[n];
    for (int r = 0; r < n; r++) {
      JsonNode rule = list.get(r);
      if (rule.isNull()) {
        continue;  // Spark's
      }
      ruleChecks[r] = Check.named(rule.path("check").asText(), "rule " + (r + 1) + ": " + rule);
      ruleFields[r] = field(rule.path("field"), "rule " + (r + 1));
      ruleLimits[r] = rule.path("limit").asInt(0);
    }
    eventTypeField = field(spec.path("event_type_field"), "event_type_field");
    eventTypes = texts(spec.path("event_types"));
    pricedEventTypes = texts(spec.path("priced_event_types"));
    String blanks = spec.path("whitespace").asText();
    for (int i = 0; i < blanks.length(); i++) {
      char blank = blanks.charAt(i);
      if (blank >= whitespace.length) {
        throw new IllegalArgumentException("whitespace must be ASCII: " + spec.path("whitespace"));
      }
      whitespace[blank] = true;
    }
    whitespaceSet = UTF8String.fromString(blanks);
    priceMax = spec.path("price_max").asDouble();
    quantityMax = spec.path("quantity_max").asDouble();
    JsonNode time = spec.path("time_field");
    timeField = time.isMissingNode() || time.isNull() ? -1 : field(time, "time_field");
    isoPattern = spec.path("iso_pattern").asText();
    if (timeField >= 0 && isoPattern.isEmpty()) {
      throw new IllegalArgumentException("time_field needs the iso_pattern its texts match");
    }
    Pattern.compile(isoPattern);  // a pattern Java cannot read is the table's error, here
  }

  private int field(JsonNode position, String what) {
    if (!position.canConvertToInt() || position.asInt() < 0 || position.asInt() >= names.length) {
      throw new IllegalArgumentException(what + " names no field: " + position);
    }
    return position.asInt();
  }

  private static UTF8String[] texts(JsonNode values) {
    UTF8String[] out = new UTF8String[values.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = UTF8String.fromString(values.get(i).asText());
    }
    return out;
  }

  /** On the executor, once per deserialized instance (a task): the lookup and the settings. */
  private void setUp() {
    HashMap<String, Integer> map = new HashMap<>();
    for (int i = 0; i < names.length; i++) {
      // interned, as the parser's field names are: a lookup then ends at the identity test
      // of String.equals instead of comparing the bytes of two copies
      map.put(names[i].intern(), i);
    }
    SQLConf conf = SQLConf.get();
    allowDuplicateKeys = Boolean.parseBoolean(
        conf.getConfString("spark.sql.variant.allowDuplicateKeys", "false"));
    validateUnicode = Boolean.parseBoolean(
        conf.getConfString("spark.sql.variant.validateUnicodeInJsonParsing", "true"));
    factory = new JsonFactory();
    iso = Pattern.compile(isoPattern);
    sessionZone = DateTimeUtils.getZoneId(conf.sessionLocalTimeZone());
    index = map;
  }

  /**
   * Registers {@code function} in {@code session} as the function {@code name} of one binary
   * argument, returning {@code type} (the struct described above).
   *
   * <p>Why not a UDF: Spark converts a UDF's {@code Row} to its own row field by field, and
   * encodes every Java {@code String} in it anew; those converters and encodings were a
   * fifth of this function's samples in a profile of the stream's drain. Spark's
   * {@code Invoke} of {@link #fields} on the object (a literal of the plan) takes Spark's
   * own row as it is, in the generated code of the stage, with no conversion.
   */
  public static void register(SparkSession session, String name, ContractFields function,
      DataType type) {
    function.label = name;
    session.sessionState().functionRegistry().createOrReplaceTempFunction(
        name, new Builder(name, function, type), "java_udf");
  }

  /** What the session's function registry calls with the arguments of each call. */
  private static final class Builder extends AbstractFunction1<Seq<Expression>, Expression>
      implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    private final String name;
    private final ContractFields function;
    private final DataType type;

    Builder(String name, ContractFields function, DataType type) {
      this.name = name;
      this.function = function;
      this.type = type;
    }

    @Override
    public Expression apply(Seq<Expression> arguments) {
      if (arguments.size() != 1) {
        throw new IllegalArgumentException(
            name + " takes one argument, a record's bytes; it was given " + arguments.size());
      }
      Seq<AbstractDataType> binary =
          CollectionConverters.asScala(java.util.List.<AbstractDataType>of(
              org.apache.spark.sql.types.BinaryType$.MODULE$)).toSeq();
      return new Invoke(Literal$.MODULE$.fromObject(function), "fields", type, arguments,
          binary, true, true, true);
    }
  }

  @Override
  public String toString() {
    return label;
  }

  /** The fields of one record (null for null), as Spark's own row: see the class comment. */
  public InternalRow fields(byte[] bytes) {
    if (bytes == null) {
      return null;
    }
    if (index == null) {
      setUp();
    }
    Object[] out = new Object[3 + 3 * names.length];
    if (onePass && bytes.length <= FLAT_MAX_BYTES && flatCandidate(bytes) && readFlat(bytes, out)) {
      return withRule(out);
    }
    Arrays.fill(out, null);
    Variant doc;
    try {
      doc = VariantBuilder.parseJson(new String(bytes, StandardCharsets.UTF_8),
          allowDuplicateKeys, validateUnicode);
    } catch (Exception e) {  // malformed, a duplicate key, too large: try_parse_json's null
      out[0] = Boolean.FALSE;
      return new GenericInternalRow(out);
    }
    out[0] = Boolean.TRUE;
    if (doc.getType() != org.apache.spark.types.variant.VariantUtil.Type.OBJECT) {
      return new GenericInternalRow(out);
    }
    int size = doc.objectSize();
    for (int i = 0; i < size; i++) {
      Variant.ObjectField field = doc.getFieldAtIndex(i);
      Integer at = index.get(field.key);
      if (at != null) {
        read(field.value, at, out);
      }
    }
    return withRule(out);
  }

  /**
   * The row of an object's fields, with its time (see {@link #isoTime}) and the first of this
   * function's rules that holds.
   */
  private InternalRow withRule(Object[] out) {
    if (timeField >= 0 && out[1 + 3 * timeField] == STRING) {
      out[out.length - 2] = isoTime((UTF8String) out[2 + 3 * timeField]);
    }
    for (int r = 0; r < ruleChecks.length; r++) {
      if (ruleChecks[r] != null && holds(r, out)) {
        out[out.length - 1] = r + 1;
        break;
      }
    }
    return new GenericInternalRow(out);
  }

  /**
   * A text's time in microseconds since the epoch, as Spark's {@code when(text rlike iso,
   * try_to_timestamp(text))} gives it (features/validation.py, _parse_event_time); null
   * where that is null.
   *
   * <p>Why: Spark's cast of the text looks up the time zone of its offset for every record
   * ({@code getZoneId}, two {@code String.replaceFirst} that compile their patterns anew,
   * then {@code ZoneId.of}), and the {@code rlike} runs a regular expression: with the cast's
   * own parse, about 5 % of the executors' samples in a profile of the stream's drain. The
   * shape the contract's producers write, {@code yyyy-MM-ddTHH:mm:ss} with an optional
   * fraction of up to six digits and {@code Z} or {@code +hh:mm} (or none), always matches
   * the pattern, and its value is computed here with the java.time calls Spark's cast makes
   * ({@code LocalDateTime.of}, {@code ZonedDateTime.of}, {@code ZoneOffset} for the offset):
   * an invalid date, time or offset is null, as there. Any other text (no seconds, a
   * lower-case letter, blanks around it, more digits) takes Spark's own way: the pattern,
   * then {@code DateTimeUtils.stringToTimestamp} in the session's zone.
   */
  private Long isoTime(UTF8String text) {
    int n = text.numBytes();
    if (n >= 19 && digits(text, 0, 4) && text.getByte(4) == '-' && digits(text, 5, 2)
        && text.getByte(7) == '-' && digits(text, 8, 2)
        && (text.getByte(10) == 'T' || text.getByte(10) == ' ') && digits(text, 11, 2)
        && text.getByte(13) == ':' && digits(text, 14, 2) && text.getByte(16) == ':'
        && digits(text, 17, 2)) {
      int at = 19;
      int micros = 0;
      boolean plain = true;
      if (at < n && text.getByte(at) == '.') {
        int start = ++at;
        while (at < n && at - start <= 6 && isDigit(text.getByte(at))) {
          at++;
        }
        int count = at - start;
        plain = count >= 1 && count <= 6;
        if (plain) {
          micros = value(text, start, count);
          for (int i = count; i < 6; i++) {
            micros *= 10;
          }
        }
      }
      ZoneId zone = null;
      if (!plain) {
        // seven digits or more, or a point with none: Spark's way below
      } else if (at == n) {
        zone = sessionZone;
      } else if (at == n - 1 && text.getByte(at) == 'Z') {
        zone = ZoneOffset.UTC;
      } else if (at == n - 6 && (text.getByte(at) == '+' || text.getByte(at) == '-')
          && digits(text, at + 1, 2) && text.getByte(at + 3) == ':' && digits(text, at + 4, 2)) {
        int sign = text.getByte(at) == '-' ? -1 : 1;
        try {
          zone = ZoneOffset.ofHoursMinutes(sign * value(text, at + 1, 2),
              sign * value(text, at + 4, 2));
        } catch (DateTimeException e) {
          return null;  // past 18 hours, or 60 minutes: Spark's ZoneId.of refuses it too
        }
      }
      if (zone != null) {
        try {
          LocalDateTime local = LocalDateTime.of(value(text, 0, 4), value(text, 5, 2),
              value(text, 8, 2), value(text, 11, 2), value(text, 14, 2), value(text, 17, 2),
              micros * 1000);
          long seconds = ZonedDateTime.of(local, zone).toEpochSecond();
          return Math.addExact(Math.multiplyExact(seconds, 1_000_000L), micros);
        } catch (DateTimeException | ArithmeticException e) {
          return null;  // no such date or time (February 30th, 24:00)
        }
      }
    }
    if (!iso.matcher(text.toString()).find(0)) {  // Spark's rlike
      return null;
    }
    scala.Option<Object> parsed = DateTimeUtils.stringToTimestamp(text, sessionZone);
    return parsed.isDefined() ? (Long) parsed.get() : null;
  }

  private static boolean isDigit(byte b) {
    return b >= '0' && b <= '9';
  }

  private static boolean digits(UTF8String text, int from, int count) {
    for (int i = from; i < from + count; i++) {
      if (!isDigit(text.getByte(i))) {
        return false;
      }
    }
    return true;
  }

  private static int value(UTF8String text, int from, int count) {
    int value = 0;
    for (int i = from; i < from + count; i++) {
      value = value * 10 + (text.getByte(i) - '0');
    }
    return value;
  }

  /**
   * Whether rule {@code r} holds, as its Spark expression in features/validation.py
   * (_condition) says: a field that is absent or JSON null is missing, and only a present
   * field's other rules can hold. A text here is Spark's UTF8String, so its length and its
   * trim are Spark's (char_length, btrim).
   */
  private boolean holds(int r, Object[] out) {
    int base = 1 + 3 * ruleFields[r];
    Object type = out[base];
    Check check = ruleChecks[r];
    if (check == Check.MISSING_PRICE) {
      UTF8String kind = (UTF8String) out[2 + 3 * eventTypeField];
      return (type == null || type == VOID) && kind != null && among(kind, pricedEventTypes);
    }
    if (type == null || type == VOID) {
      return check == Check.MISSING;
    }
    UTF8String text = (UTF8String) out[base + 1];
    Double number = (Double) out[base + 2];
    switch (check) {
      case NOT_STRING:
        return type != STRING;
      case BLANK:
        return blank(text);
      case TOO_LONG:
        return text.numBytes() > ruleLimits[r] && text.numChars() > ruleLimits[r];
      case UNKNOWN_EVENT_TYPE:
        return !among(text, eventTypes);
      case NOT_STRING_OR_NUMBER:
        return type != STRING && type != NUMBER;
      case NOT_NUMBER:
        return type != NUMBER;
      case PRICE_OVERFLOW:
        return !Double.isFinite(number) || number > priceMax;
      case NEGATIVE_PRICE:
        return number < 0;
      case QUANTITY_OVERFLOW:
        return !Double.isFinite(number) || Math.abs(number) > quantityMax;
      case INVALID_QUANTITY:
        return number % 1.0 != 0.0 || number < 1;
      default:  // MISSING, of a present field
        return false;
    }
  }

  /**
   * Empty, or only the contract's whitespace (as Spark's btrim of it leaves nothing). The
   * first byte settles nearly every field: a text that does not start with whitespace is not
   * blank. Why: a startsWith of each whitespace character, for every string field of every
   * record, was 2.5 % of the executors' samples in a profile of the stream's drain.
   */
  private boolean blank(UTF8String text) {
    if (text.numBytes() == 0) {
      return true;
    }
    byte first = text.getByte(0);
    return first >= 0 && whitespace[first] && text.trim(whitespaceSet).numBytes() == 0;
  }

  private static boolean among(UTF8String text, UTF8String[] values) {
    for (UTF8String value : values) {
      if (value.equals(text)) {
        return true;
      }
    }
    return false;
  }

  private void read(Variant value, int at, Object[] out) {
    int base = 1 + 3 * at;
    switch (value.getType()) {
      case NULL:
        out[base] = VOID;
        return;
      case STRING:
        out[base] = STRING;
        out[base + 1] = UTF8String.fromString(value.getString());
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
        out[base] = OTHER;
    }
    if (wantsText[at]) {
      out[base + 1] = UTF8String.fromString(value.toJson(ZoneOffset.UTC));
    }
  }

  private void number(int at, Object[] out, double number) {
    int base = 1 + 3 * at;
    out[base] = NUMBER;
    if (wantsNumber[at]) {
      out[base + 2] = number;
    }
  }

  /**
   * Whether Jackson's UTF-8 parser may read the record: it starts with the object's brace
   * and a second byte that is not zero. On bytes, Jackson first guesses the encoding, and
   * skips a UTF-8 byte-order mark; a String of the same bytes has neither, so a record that
   * starts otherwise (with a mark, blanks, or a zero byte that reads as UTF-16 or UTF-32)
   * goes to parseJson, which reads the String as Spark does.
   */
  private static boolean flatCandidate(byte[] bytes) {
    return bytes.length >= 2 && bytes[0] == '{' && bytes[1] != 0;
  }

  /**
   * The fields of a flat object, as call() returns them, in one pass of the parser; false
   * when the record needs parseJson (then {@code out} is partly written and is cleared).
   */
  private boolean readFlat(byte[] bytes, Object[] out) {
    if (allowDuplicateKeys) {
      return false;  // which of a key's values counts is parseJson's to say
    }
    String[] seen = new String[16];  // the keys so far (a record has a dozen)
    int count = 0;
    try (JsonParser parser = factory.createParser(bytes)) {
      if (parser.nextToken() != JsonToken.START_OBJECT) {
        return false;
      }
      JsonToken token;
      while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
        String name = parser.currentName();
        if (validateUnicode && !validUnicode(name)) {
          return false;
        }
        for (int i = 0; i < count; i++) {
          if (seen[i].equals(name)) {
            return false;
          }
        }
        if (count == seen.length) {
          seen = Arrays.copyOf(seen, count * 2);
        }
        seen[count++] = name;
        Integer at = index.get(name);
        token = parser.nextToken();
        int base = at == null ? -1 : 1 + 3 * at;
        switch (token) {
          case VALUE_STRING: {
            UTF8String value = plainText(parser, bytes);
            if (value == null) {
              String text = parser.getText();
              if (validateUnicode && !validUnicode(text)) {
                return false;
              }
              value = base >= 0 ? UTF8String.fromString(text) : null;
            }
            if (base >= 0) {
              out[base] = STRING;
              out[base + 1] = value;
            }
            break;
          }
          case VALUE_NULL:
            if (base >= 0) {
              out[base] = VOID;
            }
            break;
          case VALUE_NUMBER_INT:
          case VALUE_NUMBER_FLOAT: {
            double value = numberOf(parser, token);
            if (at != null) {
              if (wantsText[at]) {
                return false;  // its text is the variant's JSON of the number
              }
              number(at, out, value);
            }
            break;
          }
          default:  // an object, an array, a boolean: parseJson reads them
            return false;
        }
      }
      if (token != JsonToken.END_OBJECT) {
        return false;
      }
    } catch (IOException | RuntimeException e) {
      return false;  // parseJson fails on it too, and says so its own way
    }
    out[0] = Boolean.TRUE;
    return true;
  }

  /**
   * The current string token's value, when it is plain ASCII text with no escape: its bytes
   * between the quotes, which are its UTF-8 as they stand (and hold no surrogate, so the
   * Unicode check has nothing to find). Null for any other string, which the caller reads
   * through Jackson as before. Why: Jackson decoded each string to a Java String and Spark
   * encoded it back to UTF-8; the bytes are already there. Jackson then skips the string's
   * bytes itself when it reads on.
   */
  private static UTF8String plainText(JsonParser parser, byte[] bytes) {
    long quote = parser.currentTokenLocation().getByteOffset();
    if (quote < 0 || quote >= bytes.length || bytes[(int) quote] != '"') {
      return null;
    }
    int start = (int) quote + 1;
    for (int i = start; i < bytes.length; i++) {
      byte b = bytes[i];
      if (b == '"') {
        return UTF8String.fromBytes(bytes, start, i - start);
      }
      if (b == '\\' || b < 0x20) {  // an escape, a control character, or a non-ASCII byte
        return null;
      }
    }
    return null;
  }

  /** A JSON number's value as VariantBuilder stores it (long, decimal, else double). */
  private static double numberOf(JsonParser parser, JsonToken token) throws IOException {
    if (token == JsonToken.VALUE_NUMBER_INT) {
      try {
        return (double) parser.getLongValue();
      } catch (InputCoercionException tooLarge) {
        // as VariantBuilder: a decimal if it fits, else a double
      }
    }
    String digits = parser.getText();
    for (int i = 0; i < digits.length(); i++) {
      char ch = digits.charAt(i);
      if (ch != '-' && ch != '.' && !(ch >= '0' && ch <= '9')) {
        return parser.getDoubleValue();
      }
    }
    BigDecimal decimal = new BigDecimal(digits);
    if (decimal.scale() <= MAX_DECIMAL_PRECISION && decimal.precision() <= MAX_DECIMAL_PRECISION) {
      return decimal.doubleValue();
    }
    return parser.getDoubleValue();
  }

  /** No lone surrogate: what VariantBuilder checks of each key and string it parses. */
  private static boolean validUnicode(String value) {
    for (int i = 0, n = value.length(); i < n; i++) {
      char ch = value.charAt(i);
      if (Character.isHighSurrogate(ch)) {
        if (i + 1 >= n || !Character.isLowSurrogate(value.charAt(i + 1))) {
          return false;
        }
        i++;
      } else if (Character.isLowSurrogate(ch)) {
        return false;
      }
    }
    return true;
  }
}
