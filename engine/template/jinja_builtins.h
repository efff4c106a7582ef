// Jinja's filters and tests, and the methods of Python's str, dict and list
// that chat templates call (none that modify anything: the sandbox is
// immutable, as Hugging Face's is).
#pragma once

#include <functional>
#include <string>

#include "template/jinja_value.h"

namespace phaselab::jinja {

// Calls a filter or test by name (filters and tests may call each other, as
// map and select do): the interpreter supplies it.
struct Builtins {
  std::function<Value(const std::string& name, const Value& input, const CallArgs& args)> filter;
  std::function<bool(const std::string& name, const Value& input, const CallArgs& args)> test;
  std::function<void()> step;  // counts work against the render's limits
};

Value apply_filter(const Builtins& b, const std::string& name, const Value& input, const CallArgs& args);
bool apply_test(const Builtins& b, const std::string& name, const Value& input, const CallArgs& args);
// obj.name as Jinja's sandbox reads it: a bound method of str / dict / list,
// a dict's item, or undefined.
Value get_attribute(const Builtins& b, const Value& obj, const std::string& name);
// obj[key]: an item, or undefined.
Value get_item(const Builtins& b, const Value& obj, const Value& key);

// Python's str.strip(chars) family; chars empty: whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace phaselab::jinja
