// Runs a parsed chat template: scopes (a for loop's body and a macro's call
// have their own; if does not), the loop variable, macros, the globals, and
// the sandbox's limits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include "phaselab/jinja.h"
#include "template/jinja_ast.h"
#include "template/jinja_builtins.h"

namespace phaselab::jinja {
namespace {

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { normal, break_, continue_ };

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

class Renderer {
 public:
  Renderer(const RenderOptions& opts) : opts_(opts), start_(std::chrono::steady_clock::now()) {
    builtins_.filter = [this](const std::string& n, const Value& v, const CallArgs& a) { return filter(n, v, a); };
    builtins_.test = [this](const std::string& n, const Value& v, const CallArgs& a) { return apply_test(builtins_, n, v, a); };
    builtins_.step = [this] { step(); };
  }

  // A macro holds the scope it was defined in, and that scope holds the
  // macro (a namespace may hold itself): cycles of shared pointers. Every
  // scope and namespace made is noted and emptied when the render ends.
  ~Renderer() {
    for (auto& w : scopes_)
      if (auto s = w.lock()) s->vars.clear();
    for (auto& w : namespaces_)
      if (auto d = w.lock()) d->items.clear();
  }

  std::string run(const Body& body, const nlohmann::ordered_json& context) {
    auto globals = new_scope(nullptr);
    add_globals(*globals);
    if (!context.is_object()) throw Error("the template's context must be a JSON object");
    for (auto it = context.begin(); it != context.end(); ++it) globals->set(it.key(), Value::from_json(it.value()));
    auto top = new_scope(globals);
    std::string out;
    out_ = &out;
    exec(body, top);
    return out;
  }

 private:
  RenderOptions opts_;
  std::chrono::steady_clock::time_point start_;
  uint64_t steps_ = 0;
  int depth_ = 0;
  std::string* out_ = nullptr;
  Builtins builtins_;
  const Value* block_text_ = nullptr;  // a filter block's rendered body
  std::vector<std::weak_ptr<Scope>> scopes_;
  std::vector<std::weak_ptr<Dict>> namespaces_;
  size_t scopes_pruned_at_ = 64;

  ScopePtr new_scope(ScopePtr parent) {
    auto s = std::make_shared<Scope>();
    s->parent = std::move(parent);
    if (scopes_.size() >= scopes_pruned_at_ * 2) {  // forget those already gone (a loop's passes)
      std::erase_if(scopes_, [](const std::weak_ptr<Scope>& w) { return w.expired(); });
      scopes_pruned_at_ = std::max<size_t>(64, scopes_.size());
    }
    scopes_.push_back(s);
    return s;
  }

  struct DepthGuard {
    Renderer* r;
    explicit DepthGuard(Renderer* rr) : r(rr) {
      if (++r->depth_ > r->opts_.limits.max_depth)
        throw Error("the template nests deeper than " + std::to_string(r->opts_.limits.max_depth) +
                    " (recursion without an end?)");
    }
    ~DepthGuard() { --r->depth_; }
  };

  void step() {
    if (++steps_ > opts_.limits.max_steps)
      throw Error("the template ran more than " + std::to_string(opts_.limits.max_steps) + " steps (a loop without an end?)");
    if ((steps_ & 4095) == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      if (s > opts_.limits.max_seconds)
        throw Error("the template ran longer than " + std::to_string(opts_.limits.max_seconds) + " s");
    }
  }

  void emit(const std::string& s) {
    if (out_->size() + s.size() > opts_.limits.max_output)
      throw Error("the template's output is larger than " + std::to_string(opts_.limits.max_output) + " bytes");
    *out_ += s;
  }

  Value filter(const std::string& name, const Value& v, const CallArgs& a) {
    step();
    return apply_filter(builtins_, name, v, a);
  }

  void add_globals(Scope& g) {
    g.set("raise_exception", Value::function([](const CallArgs& a) -> Value {
            throw Error(a.pos.empty() ? std::string("raise_exception() called") : to_str(a.pos[0]));
          }));
    g.set("range", Value::function([this](const CallArgs& a) {
            int64_t start = 0, stop = 0, stepv = 1;
            for (const Value& v : a.pos)
              if (v.kind != Value::Kind::integer) throw Error("range() needs integers");
            if (a.pos.size() == 1) stop = a.pos[0].i;
            else if (a.pos.size() >= 2) {
              start = a.pos[0].i;
              stop = a.pos[1].i;
              if (a.pos.size() >= 3) stepv = a.pos[2].i;
            } else {
              throw Error("range expected at least 1 argument, got 0");
            }
            if (stepv == 0) throw Error("range() arg 3 must not be zero");
            List out;
            for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) {
              step();
              out.push_back(Value::integer(i));
            }
            return Value::new_list(std::move(out));
          }));
    g.set("namespace", Value::function([this](const CallArgs& a) {
            Value ns = Value::new_dict();
            ns.dict->is_namespace = true;
            namespaces_.push_back(ns.dict);
            for (const Value& v : a.pos) {
              if (!v.is_dict()) throw Error("namespace() takes a mapping or keyword arguments");
              for (const auto& [k, x] : v.dict->items) ns.dict->set(k, x);
            }
            for (const auto& [k, x] : a.kw) ns.dict->set(k, x);
            return ns;
          }));
    g.set("dict", Value::function([](const CallArgs& a) {
            Value d = Value::new_dict();
            for (const Value& v : a.pos) {
              if (!v.is_dict()) throw Error("dict() takes a mapping or keyword arguments");
              for (const auto& [k, x] : v.dict->items) d.dict->set(k, x);
            }
            for (const auto& [k, x] : a.kw) d.dict->set(k, x);
            return d;
          }));
    g.set("strftime_now", Value::function([this](const CallArgs& a) {
            if (a.pos.empty() || !a.pos[0].is_string()) throw Error("strftime_now() needs a format string");
            const std::time_t t = opts_.now ? *opts_.now : std::time(nullptr);
            std::tm tm{};
            localtime_r(&t, &tm);  // transformers: datetime.now(), local time
            char buf[256];
            const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
            return Value::string(std::string(buf, n));
          }));
  }

  // ---- statements ----

  Flow exec(const Body& body, const ScopePtr& scope) {
    DepthGuard g(this);
    for (const auto& s : body) {
      const Flow f = exec(*s, scope);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  std::string capture(const Body& body, const ScopePtr& scope) {
    std::string text;
    std::string* saved = out_;
    out_ = &text;
    try {
      exec(body, scope);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return text;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope) {
    step();
    try {
      return exec_inner(s, scope);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("template line ", 0) == 0) throw;
      throw Error("template line " + std::to_string(s.line) + ": " + what);
    }
  }

  Flow exec_inner(const Stmt& s, const ScopePtr& scope) {
    switch (s.kind) {
      case Stmt::Kind::text: emit(s.text); return Flow::normal;
      case Stmt::Kind::output: emit(to_str(eval(*s.expr, scope))); return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [cond, body] : s.branches)
          if (!cond || eval(*cond, scope).truthy()) return exec(body, scope);
        return Flow::normal;
      case Stmt::Kind::for_: exec_for(s, scope); return Flow::normal;
      case Stmt::Kind::set: {
        Value v = eval(*s.expr, scope);
        if (!s.attr.empty()) {
          const Value* ns = scope->find(s.targets[0]);
          if (!ns || !ns->is_dict() || !ns->dict->is_namespace)
            throw Error("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
          ns->dict->set(s.attr, std::move(v));
        } else {
          assign(s.targets, v, *scope);
        }
        return Flow::normal;
      }
      case Stmt::Kind::set_block: {
        Value v = Value::string(capture(s.body, scope));
        if (s.expr) v = apply_block_filter(*s.expr, v, scope);
        scope->set(s.targets[0], std::move(v));
        return Flow::normal;
      }
      case Stmt::Kind::macro: scope->set(s.name, make_macro(s, scope)); return Flow::normal;
      case Stmt::Kind::call_block: {
        const Stmt* stmt = &s;
        ScopePtr sc = scope;
        Value caller = Value::function([this, stmt, sc](const CallArgs&) {
          auto inner = new_scope(sc);
          return Value::string(capture(stmt->body, inner));
        });
        emit(to_str(call(*s.expr, scope, &caller)));
        return Flow::normal;
      }
      case Stmt::Kind::filter_block: {
        Value text = Value::string(capture(s.body, scope));
        emit(to_str(apply_block_filter(*s.expr, text, scope)));
        return Flow::normal;
      }
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
      case Stmt::Kind::generation: return exec(s.body, scope);
    }
    return Flow::normal;
  }

  Value apply_block_filter(const Expr& chain, const Value& text, const ScopePtr& scope) {
    const Value* saved = block_text_;
    block_text_ = &text;
    Value v;
    try {
      v = eval(chain, scope);
    } catch (...) {
      block_text_ = saved;
      throw;
    }
    block_text_ = saved;
    return v;
  }

  static void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.set(targets[0], v);
      return;
    }
    List items = iterate(v);
    if (items.size() != targets.size())
      throw Error("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                  " names");
    for (size_t k = 0; k < targets.size(); ++k) scope.set(targets[k], items[k]);
  }

  void exec_for(const Stmt& s, const ScopePtr& scope) {
    const Value seq = eval(*s.expr, scope);
    List items = iterate(seq);
    if (s.condition) {  // for x in xs if cond: the loop sees only those that pass
      auto test = new_scope(scope);
      List kept;
      for (const Value& item : items) {
        step();
        assign(s.targets, item, *test);
        if (eval(*s.condition, test).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(s.else_body, scope);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      step();
      Value loop = Value::new_dict();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(n - k));
      d.set("revindex0", Value::integer(n - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
      d.set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
      d.set("cycle", Value::function([k](const CallArgs& a) {
              if (a.pos.empty()) throw Error("no items for cycling given");
              return a.pos[static_cast<size_t>(k) % a.pos.size()];
            }));
      // Each pass has its own scope: a set in the body lasts one pass.
      auto pass = new_scope(scope);
      pass->set("loop", loop);
      assign(s.targets, items[static_cast<size_t>(k)], *pass);
      if (exec(s.body, pass) == Flow::break_) break;
    }
  }

  Value make_macro(const Stmt& s, const ScopePtr& def_scope) {
    const Stmt* stmt = &s;
    return Value::function([this, stmt, def_scope](const CallArgs& a) {
      DepthGuard g(this);
      auto scope = new_scope(def_scope);
      if (a.pos.size() > stmt->params.size())
        throw Error("macro '" + stmt->name + "' takes " + std::to_string(stmt->params.size()) + " arguments, got " +
                    std::to_string(a.pos.size()));
      for (const auto& [k, v] : a.kw) {
        bool known = k == "caller";
        for (const auto& p : stmt->params) known = known || p.first == k;
        if (!known) throw Error("macro '" + stmt->name + "' takes no keyword argument '" + k + "'");
      }
      for (size_t i = 0; i < stmt->params.size(); ++i) {
        const auto& [pname, def] = stmt->params[i];
        const Value* given = nullptr;
        for (const auto& [k, v] : a.kw)
          if (k == pname) given = &v;
        if (!given && i < a.pos.size()) given = &a.pos[i];
        if (given) scope->set(pname, *given);
        else if (def) scope->set(pname, eval(*def, scope));
        else scope->set(pname, Value::undefined("'" + pname + "' is undefined (an argument of macro '" + stmt->name + "')"));
      }
      for (const auto& [k, v] : a.kw)
        if (k == "caller") scope->set("caller", v);
      return Value::string(capture(stmt->body, scope));
    });
  }

  // ---- expressions ----

  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, scope));
    return a;
  }

  Value call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    const Value fn = eval(*e.args[0], scope);
    CallArgs a = eval_args(e, 1, scope);
    if (caller) a.kw.emplace_back("caller", *caller);
    if (fn.kind != Value::Kind::callable) {
      if (fn.is_undefined()) throw Error(fn.s.empty() ? std::string("an undefined value was called") : fn.s);
      throw Error(std::string("'") + type_name(fn) + "' object is not callable");
    }
    step();
    return (*fn.fn)(a);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    step();
    DepthGuard g(this);
    switch (e.op) {
      case Expr::Op::literal: return e.value;
      case Expr::Op::name: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Op::list: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, scope));
        Value v = Value::new_list(std::move(l));
        v.tuple = e.name == "tuple";
        return v;
      }
      case Expr::Op::dict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k], scope);
          d.dict->set(dict_key(key), eval(*e.args[k + 1], scope));
        }
        return d;
      }
      case Expr::Op::attr: return get_attribute(builtins_, eval(*e.args[0], scope), e.name);
      case Expr::Op::item: return get_item(builtins_, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Op::slice: return slice(e, scope);
      case Expr::Op::call: return call(e, scope, nullptr);
      case Expr::Op::filter: {
        Value input;
        if (e.args[0]) input = eval(*e.args[0], scope);
        else if (block_text_) input = *block_text_;
        return filter(e.name, input, eval_args(e, 1, scope));
      }
      case Expr::Op::test: {
        const Value v = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        return Value::boolean(apply_test(builtins_, e.name, v, a) != e.negated);
      }
      case Expr::Op::not_: return Value::boolean(!eval(*e.args[0], scope).truthy());
      case Expr::Op::neg:
      case Expr::Op::pos: {
        const Value v = eval(*e.args[0], scope);
        if (v.is_undefined()) throw Error(v.s);
        if (!v.is_numeric()) throw Error(std::string("bad operand type for unary -: '") + type_name(v) + "'");
        if (e.op == Expr::Op::pos) return v.kind == Value::Kind::boolean ? Value::integer(v.b) : v;
        if (v.kind == Value::Kind::number) return Value::number(-v.f);
        return Value::integer(-(v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i));
      }
      case Expr::Op::and_: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? eval(*e.args[1], scope) : a;
      }
      case Expr::Op::or_: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? a : eval(*e.args[1], scope);
      }
      case Expr::Op::cond:
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined("the conditional expression has no else");
      case Expr::Op::binary: return binary(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Op::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          if (!compare(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
    }
    return Value::undefined();
  }

  static bool contains(const Value& seq, const Value& x) {
    switch (seq.kind) {
      case Value::Kind::string:
        if (!x.is_string()) throw Error(std::string("'in <string>' requires string as left operand, not ") + type_name(x));
        return seq.s.find(x.s) != std::string::npos;
      case Value::Kind::dict: return seq.dict->find(dict_key(x)) != nullptr;
      case Value::Kind::list:
        for (const Value& v : *seq.list)
          if (equals(v, x)) return true;
        return false;
      case Value::Kind::undefined: return false;
      default: throw Error(std::string("argument of type '") + type_name(seq) + "' is not iterable");
    }
  }

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "notin") return !contains(b, a);
    if (a.is_undefined()) throw Error(a.s);
    if (b.is_undefined()) throw Error(b.s);
    if (op == "<") return less(a, b);
    if (op == ">") return less(b, a);
    if (op == "<=") return !less(b, a);
    return !less(a, b);  // >=
  }

  Value repeat(const Value& seq, int64_t n) {
    if (seq.is_string()) {
      if (n > 0 && seq.s.size() * static_cast<size_t>(n) > opts_.limits.max_output)
        throw Error("a repeated string would exceed the output limit");
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.s;
      return Value::string(out);
    }
    List out;
    for (int64_t k = 0; k < n; ++k) {
      step();
      out.insert(out.end(), seq.list->begin(), seq.list->end());
    }
    return Value::new_list(std::move(out));
  }

  Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::string(to_str(a) + to_str(b));
    if (a.is_undefined()) throw Error(a.s);
    if (b.is_undefined()) throw Error(b.s);
    const bool ints = (a.kind == Value::Kind::integer || a.kind == Value::Kind::boolean) &&
                      (b.kind == Value::Kind::integer || b.kind == Value::Kind::boolean);
    const int64_t ai = a.kind == Value::Kind::boolean ? a.b : a.i;
    const int64_t bi = b.kind == Value::Kind::boolean ? b.b : b.i;
    auto bad = [&]() -> Value {
      throw Error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.s.size() + b.s.size() > opts_.limits.max_output) throw Error("a string would exceed the output limit");
        // Markup + str escapes the str (markupsafe), either way round.
        if (a.safe != b.safe) {
          Value m = Value::string(a.safe ? a.s + html_escape(b.s) : html_escape(a.s) + b.s);
          m.safe = true;
          return m;
        }
        Value sum = Value::string(a.s + b.s);
        sum.safe = a.safe;
        return sum;
      }
      if (a.is_list() && b.is_list()) {
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::new_list(std::move(l));
      }
      if (ints) return Value::integer(ai + bi);
      if (a.is_numeric() && b.is_numeric()) return Value::number(a.as_double() + b.as_double());
      return bad();
    }
    if (op == "*") {
      if ((a.is_string() || a.is_list()) && (b.kind == Value::Kind::integer)) return repeat(a, b.i);
      if ((b.is_string() || b.is_list()) && (a.kind == Value::Kind::integer)) return repeat(b, a.i);
      if (ints) return Value::integer(ai * bi);
      if (a.is_numeric() && b.is_numeric()) return Value::number(a.as_double() * b.as_double());
      return bad();
    }
    if (!a.is_numeric() || !b.is_numeric()) {
      if (op == "%" && a.is_string()) throw Error("printf-style '%' formatting of strings is not supported");
      return bad();
    }
    if (op == "-") return ints ? Value::integer(ai - bi) : Value::number(a.as_double() - b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) throw Error("division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//") {
      if (b.as_double() == 0) throw Error("integer division or modulo by zero");
      if (ints) return Value::integer(floor_div(ai, bi));
      return Value::number(std::floor(a.as_double() / b.as_double()));
    }
    if (op == "%") {
      if (b.as_double() == 0) throw Error("integer division or modulo by zero");
      if (ints) return Value::integer(ai - floor_div(ai, bi) * bi);
      const double x = a.as_double(), y = b.as_double();
      return Value::number(x - std::floor(x / y) * y);
    }
    if (op == "**") {
      if (ints && bi >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < bi && k < 64; ++k) r *= ai;
        return Value::integer(r);
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    return bad();
  }

  Value slice(const Expr& e, const ScopePtr& scope) {
    const Value target = eval(*e.args[0], scope);
    auto opt_int = [&](const ExprPtr& x) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      const Value v = eval(*x, scope);
      if (v.is_none()) return std::nullopt;
      if (v.kind != Value::Kind::integer) throw Error("slice indices must be integers or None");
      return v.i;
    };
    const auto start = opt_int(e.args[1]), stop = opt_int(e.args[2]), stepv = opt_int(e.args[3]);
    if (target.is_undefined()) throw Error(target.s);
    std::vector<std::string> chars;
    size_t n = 0;
    if (target.is_string()) {
      chars = utf8_chars(target.s);
      n = chars.size();
    } else if (target.is_list()) {
      n = target.list->size();
    } else {
      throw Error(std::string("'") + type_name(target) + "' object is not subscriptable");
    }
    const int64_t st = stepv.value_or(1);
    if (st == 0) throw Error("slice step cannot be zero");
    const int64_t len = static_cast<int64_t>(n);
    auto adjust = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
      if (!v) return st > 0 ? def_pos : def_neg;
      int64_t x = *v;
      if (x < 0) x += len;
      if (st > 0) return std::clamp<int64_t>(x, 0, len);
      return std::clamp<int64_t>(x, -1, len - 1);
    };
    const int64_t b = adjust(start, 0, len - 1);
    const int64_t en = adjust(stop, len, -1);
    List out;
    std::string s;
    for (int64_t k = b; st > 0 ? k < en : k > en; k += st) {
      if (target.is_string()) s += chars[static_cast<size_t>(k)];
      else out.push_back((*target.list)[static_cast<size_t>(k)]);
    }
    return target.is_string() ? Value::string(s) : Value::new_list(std::move(out));
  }
};

}  // namespace

struct Template::Impl {
  Body body;
};

Template::Template(std::string_view source, const Limits& limits) : impl_(std::make_unique<Impl>()) {
  impl_->body = parse_template(source, limits.max_depth);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  Renderer r(options);
  return r.run(impl_->body, context);
}

std::string render(std::string_view source, const nlohmann::ordered_json& context, const RenderOptions& options) {
  return Template(source, options.limits).render(context, options);
}

}  // namespace phaselab::jinja
