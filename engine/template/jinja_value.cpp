#include "template/jinja_value.h"

#include "tokenizer/unicode.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace phaselab::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return i < pos.size() ? &pos[i] : nullptr;
}

std::string dict_key(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string: return (!v.s.empty() && v.s[0] == '\x01') ? "\x01s" + v.s : v.s;
    case Value::Kind::boolean: return std::string("\x01i") + (v.b ? "1" : "0");
    case Value::Kind::integer: return std::string("\x01i") + std::to_string(v.i);
    case Value::Kind::number:
      if (std::floor(v.f) == v.f && std::fabs(v.f) < 9e18) return std::string("\x01i") + std::to_string(static_cast<int64_t>(v.f));
      return std::string("\x01f") + float_repr(v.f);
    case Value::Kind::none: return "\x01n";
    default: throw Error(std::string("unhashable type: '") + type_name(v) + "'");
  }
}

Value key_value(const std::string& key) {
  if (key.empty() || key[0] != '\x01') return Value::string(key);
  const char tag = key.size() > 1 ? key[1] : 's';
  const std::string rest = key.substr(2);
  if (tag == 'i') return Value::integer(std::stoll(rest));
  if (tag == 'f') return Value::number(std::stod(rest));
  if (tag == 'n') return Value::none();
  return Value::string(rest);
}

Value Value::undefined(std::string what) {
  Value v;
  v.s = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::boolean;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::integer;
  v.i = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind = Kind::number;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(s);
  return v;
}
Value Value::new_list(List l) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<List>(std::move(l));
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::callable;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return new_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = new_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->items.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default: return none();
  }
}

double Value::as_double() const {
  switch (kind) {
    case Kind::boolean: return b ? 1 : 0;
    case Kind::integer: return static_cast<double>(i);
    case Kind::number: return f;
    default: return 0;
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b;
    case Kind::integer: return i != 0;
    case Kind::number: return f != 0;
    case Kind::string: return !s.empty();
    case Kind::list: return !list->empty();
    case Kind::dict: return !dict->items.empty();
    case Kind::callable: return true;
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::number: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return v.dict->is_namespace ? "Namespace" : "dict";
    case Value::Kind::callable: return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  // The shortest digits that read back as d, in scientific form: [-]D[.DDD]e[+-]XX.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  (void)ec;
  std::string sci(buf, end);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -5 + 1 && exp < 16) {  // Python's repr: fixed for 1e-4 <= |d| < 1e16
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out.append(digits, 0, static_cast<size_t>(exp + 1));
      out += '.';
      out.append(digits, static_cast<size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

namespace {

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + q;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  out += q;
  return out;
}

// ensure_ascii: every non-ASCII character as \uXXXX (a surrogate pair above
// U+FFFF), lower-case hex, as Python writes it.
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (ensure_ascii && c >= 0x80) {
      // Ill-formed bytes (never in a Python str) are written as U+FFFD.
      const unicode::Utf8Step step = unicode::utf8_step(s, k);
      uint32_t cp = step.kind == unicode::Utf8Step::complete ? step.cp : 0xFFFD;
      const size_t n = step.len;
      auto u = [&](uint32_t x) {
        char buf[16];  // (x < 0x10000: 6 characters)
        std::snprintf(buf, sizeof buf, "\\u%04x", x);
        out += buf;
      };
      if (cp >= 0x10000) {
        cp -= 0x10000;
        u(0xD800 + (cp >> 10));
        u(0xDC00 + (cp & 0x3FF));
      } else {
        u(cp);
      }
      k += n - 1;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, int indent, int level, const std::string& item_sep,
                const std::string& key_sep, bool sort_keys, bool ascii) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind) {
    case Value::Kind::undefined:
      throw Error("Object of type Undefined is not JSON serializable");
    case Value::Kind::callable:
      throw Error("Object of type function is not JSON serializable");
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.b ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.i); return;
    case Value::Kind::number:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::string: json_string(out, v.s, ascii); return;
    case Value::Kind::list: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_value(out, (*v.list)[k], indent, level + 1, item_sep, key_sep, sort_keys, ascii);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        const Value key = key_value(items[k]->first);
        json_string(out, key.is_string() ? key.s : key.is_none() ? "null" : to_repr(key), ascii);
        out += key_sep;
        json_value(out, items[k]->second, indent, level + 1, item_sep, key_sep, sort_keys, ascii);
      }
      newline(level);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "";
    case Value::Kind::string: return v.s;
    default: return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.b ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::number: return float_repr(v.f);
    case Value::Kind::string: return string_repr(v.s);
    case Value::Kind::list: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + to_repr((*v.list)[k]);
      if (v.tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::dict: {
      if (v.dict->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k)
        out += (k ? ", " : "") + to_repr(key_value(v.dict->items[k].first)) + ": " + to_repr(v.dict->items[k].second);
      return out + "}";
    }
    case Value::Kind::callable: return "<function>";
  }
  return "";
}

std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                    bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_value(out, v, indent, 0, item_sep, key_sep, sort_keys, ensure_ascii);
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.kind != Value::Kind::number && b.kind != Value::Kind::number)
      return (a.kind == Value::Kind::boolean ? a.b : a.i) == (b.kind == Value::Kind::boolean ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.s == b.s;
    case Value::Kind::list:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::dict:
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    case Value::Kind::callable: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.kind == Value::Kind::integer && b.kind == Value::Kind::integer) return a.i < b.i;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_list() && b.is_list()) {
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (less(x[k], y[k])) return true;
      if (less(y[k], x[k])) return false;
    }
    return x.size() < y.size();
  }
  throw Error(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) +
              "'");
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value same_markup(const Value& v, std::string s) {
  Value out = Value::string(std::move(s));
  out.safe = v.is_string() && v.safe;
  return out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const size_t n = std::min(unicode::lead_length(static_cast<uint8_t>(s[k])), s.size() - k);
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return *v.list;
    case Value::Kind::dict: {
      List out;
      out.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) out.push_back(key_value(kv.first));
      return out;
    }
    case Value::Kind::string: {
      List out;
      for (auto& c : utf8_chars(v.s)) out.push_back(Value::string(std::move(c)));
      return out;
    }
    default: throw Error(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

}  // namespace phaselab::jinja
