#include "template/jinja_builtins.h"

#include <algorithm>
#include <cmath>

namespace phaselab::jinja {
namespace {

[[noreturn]] void type_error(const std::string& what) { throw Error(what); }

const std::string kWhitespace = " \t\n\r\f\v\x1c\x1d\x1e\x1f";

std::string arg_string(const CallArgs& a, size_t i, std::string_view name, const char* fn) {
  const Value* v = a.get(i, name);
  if (!v || !v->is_string())
    type_error(std::string(fn) + "() needs a string for '" + std::string(name) + "'");
  return v->s;
}

const Value* opt_arg(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  return (v && !v->is_none()) ? v : nullptr;
}

int64_t arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t def) {
  const Value* v = opt_arg(a, i, name);
  if (!v) return def;
  if (v->kind == Value::Kind::integer) return v->i;
  if (v->kind == Value::Kind::boolean) return v->b;
  type_error("'" + std::string(name) + "' must be an integer, not " + type_name(*v));
}

bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool def) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : def;
}

size_t char_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
std::string upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's str.title(): a letter after a non-letter starts a word.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_cased ? lower(std::string(1, c))[0] : upper(std::string(1, c))[0];
      prev_cased = true;
    } else {
      prev_cased = (static_cast<unsigned char>(c) & 0x80) != 0 && prev_cased;
    }
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = upper(out.substr(0, 1))[0];
  return out;
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep) {
    size_t k = 0;
    while (k < s.size()) {
      while (k < s.size() && kWhitespace.find(s[k]) != std::string::npos) ++k;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(k);
        size_t e = rest.size();
        while (e > 0 && kWhitespace.find(rest[e - 1]) != std::string::npos) --e;
        out.push_back(rest.substr(0, e));
        break;
      }
      size_t e = k;
      while (e < s.size() && kWhitespace.find(s[e]) == std::string::npos) ++e;
      out.push_back(s.substr(k, e - k));
      k = e;
    }
    return out;
  }
  if (sep->empty()) type_error("empty separator");
  size_t k = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t f = s.find(*sep, k);
    if (f == std::string::npos) break;
    out.push_back(s.substr(k, f - k));
    k = f + sep->size();
  }
  out.push_back(s.substr(k));
  return out;
}

std::vector<std::string> py_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  if (!sep || maxsplit < 0) return py_split(s, sep, maxsplit);
  if (sep->empty()) type_error("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t f = s.rfind(*sep, end - sep->size());
    if (f == std::string::npos) break;
    out.push_back(s.substr(f + sep->size(), end - f - sep->size()));
    end = f;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    auto chars = utf8_chars(s);
    int64_t n = 0;
    for (size_t k = 0; k <= chars.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < chars.size()) out += chars[k];
    }
    return out;
  }
  size_t k = 0;
  int64_t n = 0;
  for (;;) {
    const size_t f = s.find(from, k);
    if (f == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, k, f - k);
    out += to;
    k = f + from.size();
    ++n;
  }
  out.append(s, k, std::string::npos);
  return out;
}

// str.format(): {} {0} {name} and {{ }}; no format specs.
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '{' && k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
    } else if (c == '}' && k + 1 < fmt.size() && fmt[k + 1] == '}') {
      out += '}';
      ++k;
    } else if (c == '{') {
      const size_t e = fmt.find('}', k);
      if (e == std::string::npos) type_error("Single '{' encountered in format string");
      const std::string field = fmt.substr(k + 1, e - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        type_error("format specifications in str.format are not supported: {" + field + "}");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.pos.size() ? &a.pos[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t idx = std::stoul(field);
        v = idx < a.pos.size() ? &a.pos[idx] : nullptr;
      } else {
        for (const auto& [key, val] : a.kw)
          if (key == field) v = &val;
      }
      if (!v) type_error("str.format: no argument for {" + field + "}");
      out += to_str(*v);
      k = e;
    } else if (c == '}') {
      type_error("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) type_error("startswith/endswith need a string or a tuple of strings");
    if (p.s.size() > s.size()) return false;
    return start ? s.compare(0, p.s.size(), p.s) == 0 : s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
  };
  if (what.is_list()) {
    for (const Value& p : *what.list)
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

Value str_method(const std::string& s, const std::string& name, const CallArgs& a) {
  auto chars_arg = [&](std::string* store) -> const std::string* {
    const Value* v = opt_arg(a, 0, "chars");
    if (!v) return nullptr;
    if (!v->is_string()) type_error("strip arg must be None or str");
    *store = v->s;
    return store;
  };
  std::string tmp;
  if (name == "strip") return Value::string(py_strip(s, chars_arg(&tmp), true, true));
  if (name == "lstrip") return Value::string(py_strip(s, chars_arg(&tmp), true, false));
  if (name == "rstrip") return Value::string(py_strip(s, chars_arg(&tmp), false, true));
  if (name == "upper") return Value::string(upper(s));
  if (name == "lower") return Value::string(lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "split" || name == "rsplit") {
    const Value* sepv = opt_arg(a, 0, "sep");
    if (sepv && !sepv->is_string()) type_error("must be str or None, not " + std::string(type_name(*sepv)));
    const int64_t maxsplit = arg_int(a, 1, "maxsplit", -1);
    List out;
    for (auto& part : (name == "split" ? py_split : py_rsplit)(s, sepv ? &sepv->s : nullptr, maxsplit))
      out.push_back(Value::string(std::move(part)));
    return Value::new_list(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    size_t k = 0;
    while (k < s.size()) {
      size_t e = s.find('\n', k);
      if (e == std::string::npos) e = s.size();
      std::string line = s.substr(k, e - k);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      out.push_back(Value::string(line));
      k = e + 1;
    }
    return Value::new_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) type_error(name + "() takes at least 1 argument (0 given)");
    return Value::boolean(starts_or_ends(s, *p, name == "startswith"));
  }
  if (name == "replace") {
    const std::string from = arg_string(a, 0, "old", "replace");
    const std::string to = arg_string(a, 1, "new", "replace");
    return Value::string(py_replace(s, from, to, arg_int(a, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string sub = arg_string(a, 0, "sub", name.c_str());
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(char_count(s) + 1));
      int64_t n = 0;
      for (size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t f = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (f == std::string::npos) {
      if (name == "index" || name == "rindex") type_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(char_count(s.substr(0, f))));
  }
  if (name == "join") {
    const Value* it = a.get(0, "iterable");
    if (!it) type_error("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(*it)) {
      if (!v.is_string()) type_error("sequence item: expected str instance, " + std::string(type_name(v)) + " found");
      if (!first) out += s;
      out += v.s;
      first = false;
    }
    return Value::string(out);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string p = arg_string(a, 0, "prefix", name.c_str());
    if (name == "removeprefix" && s.compare(0, p.size(), p) == 0) return Value::string(s.substr(p.size()));
    if (name == "removesuffix" && !p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
      return Value::string(s.substr(0, s.size() - p.size()));
    return Value::string(s);
  }
  if (name == "format") return Value::string(py_format(s, a));
  auto all_of = [&](auto pred) {
    if (s.empty()) return Value::boolean(false);
    return Value::boolean(std::all_of(s.begin(), s.end(), pred));
  };
  if (name == "isdigit") return all_of([](char c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all_of([](char c) { return is_alpha(c); });
  if (name == "isalnum") return all_of([](char c) { return is_alpha(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all_of([](char c) { return kWhitespace.find(c) != std::string::npos; });
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (char c : s) {
      if (!is_alpha(c)) continue;
      cased = true;
      if ((name == "islower") != (c >= 'a' && c <= 'z')) return Value::boolean(false);
    }
    return Value::boolean(cased);
  }
  type_error("'str' object has no attribute '" + name + "'");
}

bool is_str_method(const std::string& n) {
  static const char* names[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "split",
                                "rsplit", "splitlines", "startswith", "endswith", "replace", "find", "rfind",
                                "index", "rindex", "count", "join", "removeprefix", "removesuffix", "format",
                                "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}

bool is_mutating_method(const std::string& n) {
  static const char* names[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                "update", "setdefault", "popitem"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}

Value items_of(const Value& d) {
  List out;
  for (const auto& [k, v] : d.dict->items) {
    Value pair = Value::new_list({key_value(k), v});
    pair.tuple = true;
    out.push_back(std::move(pair));
  }
  return Value::new_list(std::move(out));
}

Value dict_method(const Value& d, const std::string& name, const CallArgs& a) {
  if (name == "items") return items_of(d);
  if (name == "keys") {
    List out;
    for (const auto& kv : d.dict->items) out.push_back(key_value(kv.first));
    return Value::new_list(std::move(out));
  }
  if (name == "values") {
    List out;
    for (const auto& kv : d.dict->items) out.push_back(kv.second);
    return Value::new_list(std::move(out));
  }
  if (name == "get") {
    const Value* key = a.get(0, "key");
    if (!key) type_error("get expected at least 1 argument, got 0");
    if (const Value* v = d.dict->find(dict_key(*key))) return *v;
    const Value* def = a.get(1, "default");
    return def ? *def : Value::none();
  }
  if (name == "copy") {
    Value c = Value::new_dict();
    c.dict->items = d.dict->items;
    return c;
  }
  type_error("'dict' object has no attribute '" + name + "'");
}

Value list_method(const Value& l, const std::string& name, const CallArgs& a) {
  const Value* x = a.get(0, "value");
  if (!x) type_error(name + "() takes exactly one argument (0 given)");
  if (name == "count") {
    int64_t n = 0;
    for (const Value& v : *l.list) n += equals(v, *x);
    return Value::integer(n);
  }
  if (name == "index") {
    for (size_t k = 0; k < l.list->size(); ++k)
      if (equals((*l.list)[k], *x)) return Value::integer(static_cast<int64_t>(k));
    type_error(to_repr(*x) + " is not in list");
  }
  type_error("'list' object has no attribute '" + name + "'");
}

int64_t to_index(int64_t i, size_t n) { return i < 0 ? i + static_cast<int64_t>(n) : i; }

// An attribute or item of v, for attribute= arguments ("a.b" and "0" allowed).
Value path_of(const Builtins& b, const Value& v, const std::string& path) {
  Value cur = v;
  size_t k = 0;
  while (k <= path.size()) {
    size_t e = path.find('.', k);
    if (e == std::string::npos) e = path.size();
    const std::string part = path.substr(k, e - k);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      cur = get_item(b, cur, Value::integer(std::stoll(part)));
    else
      cur = get_item(b, cur, Value::string(part));
    k = e + 1;
  }
  return cur;
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(lower(v.s));
  return v;
}

// The arguments after the first `skip` positional ones, for a test or filter
// that select/map pass on.
CallArgs rest_args(const CallArgs& a, size_t skip) {
  CallArgs r;
  for (size_t k = skip; k < a.pos.size(); ++k) r.pos.push_back(a.pos[k]);
  r.kw = a.kw;
  return r;
}

Value select_like(const Builtins& b, const Value& input, const CallArgs& a, bool by_attr, bool keep) {
  List out;
  if (!input.truthy()) return Value::new_list();  // Jinja: "if seq:" (none selects nothing)
  for (const Value& v : iterate(input)) {
    b.step();
    bool pass;
    if (by_attr) {
      if (a.pos.empty()) type_error("selectattr/rejectattr need an attribute name");
      const Value item = path_of(b, v, to_str(a.pos[0]));
      pass = a.pos.size() < 2 ? item.truthy() : b.test(to_str(a.pos[1]), item, rest_args(a, 2));
    } else {
      pass = a.pos.empty() ? v.truthy() : b.test(to_str(a.pos[0]), v, rest_args(a, 1));
    }
    if (pass == keep) out.push_back(v);
  }
  return Value::new_list(std::move(out));
}

}  // namespace

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  if (!chars) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && kWhitespace.find(s[b]) != std::string::npos) ++b;
    if (right)
      while (e > b && kWhitespace.find(s[e - 1]) != std::string::npos) --e;
    return s.substr(b, e - b);
  }
  const auto set = utf8_chars(*chars);
  auto cs = utf8_chars(s);
  size_t b = 0, e = cs.size();
  auto in = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  if (left)
    while (b < e && in(cs[b])) ++b;
  if (right)
    while (e > b && in(cs[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cs[k];
  return out;
}

Value get_attribute(const Builtins& b, const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::undefined:
      throw Error(obj.s.empty() ? std::string("a value is undefined") : obj.s);
    case Value::Kind::string:
      if (is_str_method(name)) {
        // A Markup's methods give Markup (markupsafe wraps them).
        const Value self = obj;
        return Value::function([self, name](const CallArgs& a) {
          Value r = str_method(self.s, name, a);
          if (r.is_string() && self.safe) r.safe = true;
          return r;
        });
      }
      break;
    case Value::Kind::dict: {
      if (!obj.dict->is_namespace) {
        static const char* methods[] = {"items", "keys", "values", "get", "copy"};
        if (std::find(std::begin(methods), std::end(methods), name) != std::end(methods)) {
          const Value d = obj;
          return Value::function([d, name](const CallArgs& a) { return dict_method(d, name, a); });
        }
        if (is_mutating_method(name))
          return Value::function([name](const CallArgs&) -> Value {
            throw Error("access to attribute '" + name + "' of 'dict' object is unsafe (templates cannot modify values)");
          });
      }
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
    }
    case Value::Kind::list:
      if (name == "count" || name == "index") {
        const Value l = obj;
        return Value::function([l, name](const CallArgs& a) { return list_method(l, name, a); });
      }
      if (is_mutating_method(name))
        return Value::function([name](const CallArgs&) -> Value {
          throw Error("access to attribute '" + name + "' of 'list' object is unsafe (templates cannot modify values)");
        });
      break;
    default: break;
  }
  (void)b;
  return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
}

Value get_item(const Builtins& b, const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Value::Kind::undefined:
      throw Error(obj.s.empty() ? std::string("a value is undefined") : obj.s);
    case Value::Kind::list:
      if (key.kind == Value::Kind::integer || key.kind == Value::Kind::boolean) {
        const int64_t i = to_index(key.kind == Value::Kind::boolean ? key.b : key.i, obj.list->size());
        if (i >= 0 && i < static_cast<int64_t>(obj.list->size())) return (*obj.list)[static_cast<size_t>(i)];
        return Value::undefined("list index out of range");
      }
      break;
    case Value::Kind::string:
      if (key.kind == Value::Kind::integer) {
        const auto chars = utf8_chars(obj.s);
        const int64_t i = to_index(key.i, chars.size());
        if (i >= 0 && i < static_cast<int64_t>(chars.size())) return Value::string(chars[static_cast<size_t>(i)]);
        return Value::undefined("string index out of range");
      }
      break;
    case Value::Kind::dict:
      if (key.is_string() || key.is_numeric() || key.is_none()) {
        if (const Value* v = obj.dict->find(dict_key(key))) return *v;
        if (!key.is_string())
          return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + to_str(key) + "'");
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attribute(b, obj, key.s);
  return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + to_str(key) + "'");
}

Value apply_filter(const Builtins& b, const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "safe") {
    Value m = Value::string(to_str(v));
    m.safe = true;
    return m;
  }
  if (name == "string") return same_markup(v, to_str(v));
  if (name == "trim") {
    const Value* c = opt_arg(a, 0, "chars");
    if (c && !c->is_string()) type_error("trim: chars must be a string");
    return same_markup(v, py_strip(to_str(v), c ? &c->s : nullptr, true, true));
  }
  if (name == "upper") return same_markup(v, upper(to_str(v)));
  if (name == "lower") return same_markup(v, lower(to_str(v)));
  if (name == "capitalize") return same_markup(v, py_capitalize(to_str(v)));
  if (name == "title") return same_markup(v, py_title(to_str(v)));
  if (name == "e" || name == "escape" || name == "forceescape") {
    if (v.is_string() && v.safe && name != "forceescape") return v;
    Value m = Value::string(html_escape(to_str(v)));
    m.safe = true;
    return m;
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Value::Kind::undefined: return Value::integer(0);
      case Value::Kind::string: return Value::integer(static_cast<int64_t>(char_count(v.s)));
      case Value::Kind::list: return Value::integer(static_cast<int64_t>(v.list->size()));
      case Value::Kind::dict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      default: type_error(std::string("object of type '") + type_name(v) + "' has no len()");
    }
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) {
      const Value* d = a.get(0, "default_value");
      return d ? *d : Value::string("");
    }
    return v;
  }
  if (name == "first" || name == "last") {
    if (v.is_string()) {
      auto cs = utf8_chars(v.s);
      if (cs.empty()) return Value::undefined("No first item, sequence was empty.");
      return Value::string(name == "first" ? cs.front() : cs.back());
    }
    List items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = opt_arg(a, 0, "d");
    const Value* attr = opt_arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      b.step();
      if (!first) out += sep ? to_str(*sep) : "";
      out += to_str(attr ? path_of(b, item, to_str(*attr)) : item);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    const std::string s = to_str(v);
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) type_error("replace needs the old and the new text");
    return Value::string(py_replace(s, to_str(*from), to_str(*to), arg_int(a, 2, "count", -1)));
  }
  if (name == "int") {
    const int64_t def = arg_int(a, 0, "default", 0);
    switch (v.kind) {
      case Value::Kind::integer: return v;
      case Value::Kind::boolean: return Value::integer(v.b);
      case Value::Kind::number: return Value::integer(static_cast<int64_t>(v.f));
      case Value::Kind::string: {
        const std::string s = py_strip(v.s, nullptr, true, true);
        char* end = nullptr;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == 0) return Value::integer(i);
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == 0) return Value::integer(static_cast<int64_t>(d));
        return Value::integer(def);
      }
      default: return Value::integer(def);
    }
  }
  if (name == "float") {
    const Value* d = opt_arg(a, 0, "default");
    if (v.is_numeric()) return Value::number(v.as_double());
    if (v.is_string()) {
      const std::string s = py_strip(v.s, nullptr, true, true);
      char* end = nullptr;
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value::number(f);
    }
    return d ? *d : Value::number(0);
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::integer) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.is_numeric()) return Value::number(std::fabs(v.as_double()));
    type_error(std::string("bad operand type for abs(): '") + type_name(v) + "'");
  }
  if (name == "round") {
    if (!v.is_numeric()) type_error("round needs a number");
    const int64_t precision = arg_int(a, 0, "precision", 0);
    const Value* m = opt_arg(a, 1, "method");
    const std::string method = m ? to_str(*m) : "common";
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_double() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value::number(r / scale);
  }
  if (name == "list") return Value::new_list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::new_list();
    if (!v.is_dict()) type_error("items: can only get item pairs from a mapping");
    return items_of(v);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) type_error("dictsort needs a mapping");
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    const Value* byv = opt_arg(a, 1, "by");
    const bool by_value = byv && to_str(*byv) == "value";
    const bool reverse = arg_bool(a, 2, "reverse", false);
    List items = *items_of(v).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value& kx = (*x.list)[by_value ? 1 : 0];
      const Value& ky = (*y.list)[by_value ? 1 : 0];
      return reverse ? less(sort_key(ky, cs), sort_key(kx, cs)) : less(sort_key(kx, cs), sort_key(ky, cs));
    });
    return Value::new_list(std::move(items));
  }
  if (name == "sort") {
    const bool reverse = arg_bool(a, 0, "reverse", false);
    const bool cs = arg_bool(a, 1, "case_sensitive", false);
    const Value* attr = opt_arg(a, 2, "attribute");
    List items = iterate(v);
    auto key = [&](const Value& x) { return sort_key(attr ? path_of(b, x, to_str(*attr)) : x, cs); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(key(y), key(x)) : less(key(x), key(y));
    });
    return Value::new_list(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = utf8_chars(v.s);
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value::string(out);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "unique") {
    const bool cs = arg_bool(a, 0, "case_sensitive", false);
    List out;
    for (const Value& x : iterate(v)) {
      bool seen = false;
      for (const Value& y : out) seen = seen || equals(sort_key(x, cs), sort_key(y, cs));
      if (!seen) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "min" || name == "max") {
    List items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = items[0];
    for (const Value& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "sum") {
    const Value* attr = opt_arg(a, 0, "attribute");
    const Value* start = opt_arg(a, 1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const Value& x : iterate(v)) {
      const Value y = attr ? path_of(b, x, to_str(*attr)) : x;
      if (!total.is_numeric() || !y.is_numeric()) type_error("sum needs numbers");
      if (total.kind == Value::Kind::number || y.kind == Value::Kind::number)
        total = Value::number(total.as_double() + y.as_double());
      else
        total = Value::integer(static_cast<int64_t>(total.as_double()) + static_cast<int64_t>(y.as_double()));
    }
    return total;
  }
  if (name == "select") return select_like(b, v, a, false, true);
  if (name == "reject") return select_like(b, v, a, false, false);
  if (name == "selectattr") return select_like(b, v, a, true, true);
  if (name == "rejectattr") return select_like(b, v, a, true, false);
  if (name == "map") {
    List out;
    const Value* attr = nullptr;
    for (const auto& [k, x] : a.kw)
      if (k == "attribute") attr = &x;
    if (!v.truthy()) return Value::new_list();  // Jinja: "if value:"
    for (const Value& x : iterate(v)) {
      b.step();
      if (attr) {
        Value y = path_of(b, x, to_str(*attr));
        if (y.is_undefined())
          for (const auto& [k, d] : a.kw)
            if (k == "default") y = d;
        out.push_back(y);
      } else {
        if (a.pos.empty()) type_error("map needs a filter name or attribute=");
        out.push_back(b.filter(to_str(a.pos[0]), x, rest_args(a, 1)));
      }
    }
    return Value::new_list(std::move(out));
  }
  if (name == "attr") {
    const Value* n = a.get(0, "name");
    if (!n) type_error("attr needs a name");
    // getattr only: a dict's items are not its attributes.
    const std::string attr = to_str(*n);
    if (v.is_dict() && !v.dict->is_namespace) {
      static const char* methods[] = {"items", "keys", "values", "get", "copy"};
      if (std::find(std::begin(methods), std::end(methods), attr) == std::end(methods))
        return Value::undefined("'dict object' has no attribute '" + attr + "'");
    }
    return get_attribute(b, v, attr);
  }
  if (name == "tojson") {
    // transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent,
    // separators=separators, sort_keys=sort_keys).
    const Value* ind = opt_arg(a, 1, "indent");
    const int indent = ind ? static_cast<int>(ind->i) : -1;
    std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
    if (const Value* seps = opt_arg(a, 2, "separators")) {
      if (!seps->is_list() || seps->list->size() != 2) type_error("tojson: separators must be a pair");
      item_sep = to_str((*seps->list)[0]);
      key_sep = to_str((*seps->list)[1]);
    }
    const Value* ea = opt_arg(a, 0, "ensure_ascii");
    return Value::string(to_json(v, indent, item_sep, key_sep, arg_bool(a, 3, "sort_keys", false), ea && ea->truthy()));
  }
  if (name == "indent") {
    const Value* w = opt_arg(a, 0, "width");
    const std::string pad = !w ? std::string(4, ' ') : w->is_string() ? w->s : std::string(static_cast<size_t>(std::max<int64_t>(0, w->i)), ' ');
    const bool first = arg_bool(a, 1, "first", false);
    const bool blank = arg_bool(a, 2, "blank", false);
    // Jinja's do_indent: a newline appended, split into lines; every line
    // but the first indented (blank ones only with blank=True).
    std::vector<std::string> lines;
    const std::string s = to_str(v) + "\n";
    for (size_t k = 0; k < s.size();) {
      size_t e = s.find('\n', k);
      if (e == std::string::npos) e = s.size();
      lines.push_back(s.substr(k, e - k));
      k = e + 1;
    }
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += '\n';
      if (k && (blank || !lines[k].empty())) out += pad;
      out += lines[k];
    }
    if (first) out = pad + out;
    return Value::string(out);
  }
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
  type_error("no filter named '" + name + "'");
}

bool apply_test(const Builtins& b, const std::string& name, const Value& v, const CallArgs& a) {
  (void)b;
  auto other = [&]() -> const Value& {
    if (a.pos.empty()) type_error("the test '" + name + "' needs an argument");
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Value::Kind::boolean;
  if (name == "true") return v.kind == Value::Kind::boolean && v.b;
  if (name == "false") return v.kind == Value::Kind::boolean && !v.b;
  if (name == "integer") return v.kind == Value::Kind::integer;
  if (name == "float") return v.kind == Value::Kind::number;
  if (name == "number") return v.is_numeric();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict->is_namespace;
  if (name == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
  if (name == "iterable")
    return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace) || v.is_undefined();
  if (name == "callable") return v.kind == Value::Kind::callable;
  if (name == "lower") return to_str(v) == lower(to_str(v));
  if (name == "upper") return to_str(v) == upper(to_str(v));
  if (name == "escaped") return v.is_string() && v.safe;
  if (name == "odd" || name == "even") {
    if (v.kind != Value::Kind::integer) type_error("odd/even need an integer");
    return ((v.i % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& n = other();
    if (v.kind != Value::Kind::integer || n.kind != Value::Kind::integer || n.i == 0)
      type_error("divisibleby needs integers (and not 0)");
    return v.i % n.i == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Value::Kind::none:
      case Value::Kind::undefined: return true;
      case Value::Kind::boolean: return v.b == o.b;
      case Value::Kind::list: return v.list == o.list;
      case Value::Kind::dict: return v.dict == o.dict;
      default: return equals(v, o);
    }
  }
  if (name == "in") {
    const Value& seq = other();
    if (seq.is_string()) return v.is_string() && seq.s.find(v.s) != std::string::npos;
    for (const Value& x : iterate(seq))
      if (equals(x, v)) return true;
    return false;
  }
  type_error("no test named '" + name + "'");
}

}  // namespace phaselab::jinja
