// The values a chat template computes with: Python's None, bool, int, float,
// str, list and dict (insertion-ordered, string keys), Jinja's undefined,
// and callables (macros, bound methods, globals). Lists and dicts are shared
// (Python's reference semantics); only namespace() objects may be changed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "phaselab/jinja.h"

namespace phaselab::jinja {

struct Value;
using List = std::vector<Value>;
// A dict's keys are stored as strings: a str key as itself, any other
// hashable (int, bool, None, float) encoded behind a \x01 byte (dict_key).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): attributes may be set
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The keyword argument name, else positional argument i, else nullptr.
  const Value* get(size_t i, std::string_view name) const;
};
using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind { undefined, none, boolean, integer, number, string, list, dict, callable };
  Kind kind = Kind::undefined;
  bool b = false;
  bool tuple = false;                  // a list written as a tuple: printed (a, b)
  bool safe = false;                   // a string marked safe (|safe, |e: markupsafe's Markup):
                                       // a plain string added to it is HTML-escaped first
  int64_t i = 0;
  double f = 0;
  std::string s;                       // string; undefined: what was looked up (for the error)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;

  static Value undefined(std::string what = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value new_list(List v = {});
  static Value new_dict();
  static Value function(Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_list() const { return kind == Kind::list; }
  bool is_dict() const { return kind == Kind::dict; }
  bool is_numeric() const { return kind == Kind::integer || kind == Kind::number || kind == Kind::boolean; }
  double as_double() const;  // numeric kinds only
  bool truthy() const;
};

// A dict key for v (1, 1.0 and True are one key, as in Python), and back.
std::string dict_key(const Value& v);
Value key_value(const std::string& key);

// Python's type name, for error messages ("str", "list", "dict", ...).
const char* type_name(const Value& v);
// str(v) and repr(v) as Python writes them.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// json.dumps(v, ensure_ascii=..., indent=indent, separators=..., sort_keys=...):
// indent < 0 is None.
std::string to_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                    bool ensure_ascii = false);
// Python's ==, and < for sorting and comparisons (Error for unorderable kinds).
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
// The elements iterating over v gives (a dict's keys, a string's characters).
List iterate(const Value& v);
// Python's float repr (1.0, 1e-05, 1e+16, inf, nan).
std::string float_repr(double d);

// markupsafe's escape: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(const std::string& s);
// A string with v's Markup flag (for filters and methods that keep it).
Value same_markup(const Value& v, std::string s);

// UTF-8 helpers: a string's characters (code points) as separate strings.
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace phaselab::jinja
