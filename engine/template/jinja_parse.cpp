// Lexer and parser for chat templates. The whitespace rules are Jinja's with
// trim_blocks and lstrip_blocks on (what Hugging Face renders with):
//  - one trailing newline of the source is dropped; \r\n and \r read as \n;
//  - {%- / {{- / {#- strip all whitespace before the tag, -%} / -}} / -#}
//    all whitespace after it;
//  - trim_blocks: a newline right after %} or #} is dropped (not after }});
//  - lstrip_blocks: spaces and tabs between a line's start and {% or {# are
//    dropped (not before {{, not with {%+).
#include <cctype>
#include <cstdlib>

#include "template/jinja_ast.h"
#include "tokenizer/unicode.h"

namespace phaselab::jinja {
namespace {

struct Token {
  enum class Kind { text, var_begin, var_end, block_begin, block_end, name, string, integer, number, op, eof };
  Kind kind = Kind::eof;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("template line " + std::to_string(line) + ": " + what);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(const std::string& s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return s.substr(0, e);
}

std::string normalize(std::string_view in) {
  std::string s;
  s.reserve(in.size());
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k] == '\r') {
      s += '\n';
      if (k + 1 < in.size() && in[k + 1] == '\n') ++k;
    } else {
      s += in[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the previous match ended with a newline (or is the start)
    bool strip_next = false;    // the previous tag ended with '-'
    while (pos_ < src_.size()) {
      size_t open = std::string::npos;
      for (const char* o : {"{{", "{%", "{#"}) open = std::min(open, src_.find(o, pos_));
      std::string text = src_.substr(pos_, open == std::string::npos ? std::string::npos : open - pos_);
      if (strip_next) {
        size_t b = 0;
        while (b < text.size() && is_space(text[b])) ++b;
        text.erase(0, b);
        strip_next = false;
      }
      if (open == std::string::npos) {
        add_text(text);
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          bool ws = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k) ws = ws && (text[k] == ' ' || text[k] == '\t');
          if (ws) text.resize(l_pos);
        }
      }
      count_lines(pos_, open);
      add_text(text);
      pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail(line_, "a comment {# is never closed with #}");
        const bool minus = close > pos_ && src_[close - 1] == '-';
        count_lines(pos_, close + 2);
        pos_ = close + 2;
        line_starting = end_tag(minus, true, strip_next);
        continue;
      }
      toks_.push_back(tok(kind == '{' ? Token::Kind::var_begin : Token::Kind::block_begin));
      const bool closed = lex_tag(kind == '{' ? '}' : '%');
      if (!closed) fail(line_, kind == '{' ? "{{ is never closed with }}" : "{% is never closed with %}");
      toks_.push_back(tok(kind == '{' ? Token::Kind::var_end : Token::Kind::block_end));
      line_starting = end_tag(last_minus_, kind == '%', strip_next);
    }
    toks_.push_back(tok(Token::Kind::eof));
    return std::move(toks_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool last_minus_ = false;
  std::vector<Token> toks_;

  Token tok(Token::Kind k, std::string s = {}) {
    Token t;
    t.kind = k;
    t.s = std::move(s);
    t.line = line_;
    return t;
  }
  void add_text(const std::string& text) {
    if (!text.empty()) toks_.push_back(tok(Token::Kind::text, text));
  }
  void count_lines(size_t from, size_t to) {
    for (size_t k = from; k < to && k < src_.size(); ++k) line_ += src_[k] == '\n';
  }
  // After a closing tag at pos_: '-' strips what follows, trim_blocks drops
  // one newline after a block or comment. Returns line_starting.
  bool end_tag(bool minus, bool block, bool& strip_next) {
    if (minus) {
      strip_next = true;
      size_t k = pos_;
      while (k < src_.size() && is_space(src_[k])) ++k;
      const bool nl = k > pos_ && src_[k - 1] == '\n';
      count_lines(pos_, k);
      pos_ = k;
      strip_next = false;
      return nl;
    }
    if (block && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  // Tokens up to the closing }} or %} (c is '}' or '%'); false at the end of the source.
  bool lex_tag(char c) {
    int depth = 0;
    while (pos_ < src_.size()) {
      const char ch = src_[pos_];
      if (ch == '\n') ++line_;
      if (is_space(ch)) {
        ++pos_;
        continue;
      }
      if (depth == 0) {
        if (ch == '-' && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == c && src_[pos_ + 2] == '}') {
          pos_ += 3;
          last_minus_ = true;
          return true;
        }
        if (ch == '+' && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == c && src_[pos_ + 2] == '}') {
          pos_ += 3;
          last_minus_ = false;
          return true;
        }
        if (ch == c && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
          pos_ += 2;
          last_minus_ = false;
          return true;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        toks_.push_back(tok(Token::Kind::name, src_.substr(pos_, e - pos_)));
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(ch))) {
        lex_number();
      } else if (ch == '\'' || ch == '"') {
        lex_string(ch);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                    "]",  "(",  ")",  "{",  "}",  "<",  ">", "=", ".", ":", "|", ",", ";"};
        bool found = false;
        for (const char* op : ops) {
          const size_t n = std::char_traits<char>::length(op);
          if (src_.compare(pos_, n, op) == 0) {
            toks_.push_back(tok(Token::Kind::op, op));
            pos_ += n;
            found = true;
            if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
            if (n == 1 && (*op == ')' || *op == ']' || *op == '}')) {
              if (depth == 0) fail(line_, std::string("unexpected '") + op + "'");
              --depth;
            }
            break;
          }
        }
        if (!found) fail(line_, std::string("unexpected character '") + ch + "'");
      }
    }
    return false;
  }

  void lex_number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        e = k;
        digits();
      }
    }
    std::string text;
    for (size_t k = pos_; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t = tok(is_float ? Token::Kind::number : Token::Kind::integer, text);
    if (is_float) t.f = std::strtod(text.c_str(), nullptr);
    else t.i = std::strtoll(text.c_str(), nullptr, 10);
    toks_.push_back(t);
    pos_ = e;
  }

  // A string literal with Python's escapes.
  void lex_string(char quote) {
    const int start_line = line_;
    std::string out;
    size_t k = pos_ + 1;
    for (;; ++k) {
      if (k >= src_.size()) fail(start_line, "a string literal is never closed");
      const char ch = src_[k];
      if (ch == quote) break;
      if (ch == '\n') ++line_;
      if (ch != '\\') {
        out += ch;
        continue;
      }
      if (++k >= src_.size()) fail(start_line, "a string literal is never closed");
      const char e = src_[k];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': ++line_; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (k + n >= src_.size()) fail(start_line, "a truncated \\" + std::string(1, e) + " escape");
          const std::string hex = src_.substr(k + 1, n);
          for (char h : hex)
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail(start_line, "a bad \\" + std::string(1, e) + " escape");
          unicode::append_utf8(out, static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)));
          k += n;
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
    toks_.push_back(tok(Token::Kind::string, out));
    pos_ = k + 1;
  }
};

class Parser {
 public:
  Parser(std::vector<Token> toks, int max_depth) : t_(std::move(toks)), max_depth_(max_depth) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int max_depth_;

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* pp) : p(pp) {
      if (++p->depth_ > p->max_depth_) fail(p->cur().line, "nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == Token::Kind::op && cur().s == op; }
  bool is_name(const char* n) const { return cur().kind == Token::Kind::name && cur().s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().line, std::string("expected '") + op + "', found " + describe(cur()));
    ++p_;
  }
  std::string expect_name() {
    if (cur().kind != Token::Kind::name) fail(cur().line, "expected a name, found " + describe(cur()));
    return t_[p_++].s;
  }
  void expect_block_end() {
    if (cur().kind != Token::Kind::block_end) fail(cur().line, "expected the end of the tag, found " + describe(cur()));
    ++p_;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::eof: return "the end of the template";
      case Token::Kind::block_end: return "'%}'";
      case Token::Kind::var_end: return "'}}'";
      case Token::Kind::text: return "text";
      default: return "'" + t.s + "'";
    }
  }

  // Statements until one of the end keywords (returned in *end).
  Body parse_body(const std::vector<std::string>& ends, std::string* end) {
    DepthGuard g(this);
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.kind == Token::Kind::eof) {
        if (!ends.empty()) fail(t.line, "the template ends before {% " + ends.back() + " %}");
        return body;
      }
      if (t.kind == Token::Kind::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->line = t.line;
        s->text = t.s;
        body.push_back(std::move(s));
        ++p_;
        continue;
      }
      if (t.kind == Token::Kind::var_begin) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = t.line;
        s->expr = parse_tuple(true);
        if (cur().kind != Token::Kind::var_end) fail(cur().line, "expected '}}', found " + describe(cur()));
        ++p_;
        body.push_back(std::move(s));
        continue;
      }
      // {% ... %}
      ++p_;
      if (cur().kind != Token::Kind::name) fail(cur().line, "expected a statement name, found " + describe(cur()));
      const std::string kw = cur().s;
      for (const auto& e : ends)
        if (kw == e) {
          ++p_;
          *end = kw;
          return body;
        }
      body.push_back(parse_statement());
    }
  }

  StmtPtr parse_statement() {
    const int line = cur().line;
    const std::string kw = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string end;
    if (kw == "if") {
      s->kind = Stmt::Kind::if_;
      ExprPtr cond = parse_tuple(true);
      expect_block_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_tuple(true);
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          Body eb = parse_body({"endif"}, &end);
          s->branches.emplace_back(nullptr, std::move(eb));
        }
        expect_block_end();
        break;
      }
    } else if (kw == "for") {
      s->kind = Stmt::Kind::for_;
      s->targets = parse_targets();
      if (!is_name("in")) fail(cur().line, "expected 'in' in the for loop, found " + describe(cur()));
      ++p_;
      s->expr = parse_tuple(false);
      if (is_name("if")) {
        ++p_;
        s->condition = parse_expression(true);
      }
      if (is_name("recursive")) fail(cur().line, "recursive for loops are not supported");
      expect_block_end();
      s->body = parse_body({"else", "endfor"}, &end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
      expect_block_end();
    } else if (kw == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {
        ++p_;
        s->kind = Stmt::Kind::set;
        s->targets = {first};
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true);
        expect_block_end();
      } else {
        s->targets = {first};
        while (is_op(",")) {
          ++p_;
          s->targets.push_back(expect_name());
        }
        if (is_op("=")) {
          ++p_;
          s->kind = Stmt::Kind::set;
          s->expr = parse_tuple(true);
          expect_block_end();
        } else {
          if (s->targets.size() != 1) fail(line, "a {% set %} block assigns one name");
          s->kind = Stmt::Kind::set_block;
          if (is_op("|")) s->expr = parse_filter_chain(nullptr);
          expect_block_end();
          s->body = parse_body({"endset"}, &end);
          expect_block_end();
        }
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Kind::macro;
      s->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pname = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++p_;
          def = parse_expression(true);
        }
        s->params.emplace_back(std::move(pname), std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      expect_block_end();
      s->body = parse_body({"endmacro"}, &end);
      expect_block_end();
    } else if (kw == "call") {
      s->kind = Stmt::Kind::call_block;
      if (is_op("(")) fail(line, "{% call(args) %} with caller arguments is not supported");
      s->expr = parse_expression(true);
      if (s->expr->op != Expr::Op::call) fail(line, "{% call %} needs a macro call");
      expect_block_end();
      s->body = parse_body({"endcall"}, &end);
      expect_block_end();
    } else if (kw == "filter") {
      s->kind = Stmt::Kind::filter_block;
      --p_;  // parse "filter" as if it were '|'
      s->expr = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
      expect_block_end();
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
    } else {
      fail(line, "unknown statement '" + kw + "'");
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) ++p_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++p_;
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprPtr make(Expr::Op op, int line) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->line = line;
    return e;
  }

  // expr [, expr ...]: a tuple when there is a comma.
  ExprPtr parse_tuple(bool condexpr) {
    const int line = cur().line;
    ExprPtr first = parse_expression(condexpr);
    if (!is_op(",")) return first;
    auto list = make(Expr::Op::list, line);
    list->name = "tuple";
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      ++p_;
      if (cur().kind == Token::Kind::var_end || cur().kind == Token::Kind::block_end || is_name("in") || is_op("="))
        break;
      list->args.push_back(parse_expression(condexpr));
    }
    return list;
  }

  ExprPtr parse_expression(bool condexpr) {
    DepthGuard g(this);
    return condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      ++p_;
      auto c = make(Expr::Op::cond, line);
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++p_;
        otherwise = parse_condexpr();
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Op op, ExprPtr a, ExprPtr b, int line, std::string name = {}) {
    auto e = make(op, line);
    e->name = std::move(name);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      ++p_;
      e = binary(Expr::Op::or_, std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      ++p_;
      e = binary(Expr::Op::and_, std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(this);
      const int line = cur().line;
      ++p_;
      auto e = make(Expr::Op::not_, line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().kind == Token::Kind::op &&
          (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == "<=" || cur().s == ">" || cur().s == ">=")) {
        op = cur().s;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && peek().kind == Token::Kind::name && peek().s == "in") {
        op = "notin";
        p_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Op::compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const int line = cur().line;
      std::string op = t_[p_++].s;
      e = binary(Expr::Op::binary, std::move(e), parse_concat(), line, op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++p_;
      e = binary(Expr::Op::binary, std::move(e), parse_math2(), line, "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const int line = cur().line;
      std::string op = t_[p_++].s;
      e = binary(Expr::Op::binary, std::move(e), parse_pow(), line, op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++p_;
      e = binary(Expr::Op::binary, std::move(e), parse_unary(true), line, "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    const int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      ++p_;
      e = make(neg ? Expr::Op::neg : Expr::Op::pos, line);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::Op::literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.kind) {
      case Token::Kind::name: {
        ++p_;
        if (t.s == "true" || t.s == "True") return literal(Value::boolean(true), line);
        if (t.s == "false" || t.s == "False") return literal(Value::boolean(false), line);
        if (t.s == "none" || t.s == "None") return literal(Value::none(), line);
        auto e = make(Expr::Op::name, line);
        e->name = t.s;
        return e;
      }
      case Token::Kind::string: {
        std::string s;
        while (cur().kind == Token::Kind::string) s += t_[p_++].s;
        return literal(Value::string(std::move(s)), line);
      }
      case Token::Kind::integer: ++p_; return literal(Value::integer(t.i), line);
      case Token::Kind::number: ++p_; return literal(Value::number(t.f), line);
      case Token::Kind::op:
        if (t.s == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            auto empty = make(Expr::Op::list, line);
            empty->name = "tuple";
            return empty;
          }
          ExprPtr e = parse_expression(true);
          if (is_op(",")) {
            auto list = make(Expr::Op::list, line);
            list->name = "tuple";
            list->args.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              list->args.push_back(parse_expression(true));
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          ++p_;
          auto list = make(Expr::Op::list, line);
          while (!is_op("]")) {
            list->args.push_back(parse_expression(true));
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return list;
        }
        if (t.s == "{") {
          ++p_;
          auto dict = make(Expr::Op::dict, line);
          while (!is_op("}")) {
            dict->args.push_back(parse_expression(true));
            expect_op(":");
            dict->args.push_back(parse_expression(true));
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return dict;
        }
        break;
      default: break;
    }
    fail(line, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++p_;
        if (cur().kind == Token::Kind::integer) {
          auto it = make(Expr::Op::item, line);
          it->args.push_back(std::move(e));
          it->args.push_back(literal(Value::integer(t_[p_++].i), line));
          e = std::move(it);
          continue;
        }
        auto a = make(Expr::Op::attr, line);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++p_;
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    // [a], [a:b], [a:b:c], [:], [::-1]
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression(true);
    while (is_op(":") && colons < 2) {
      ++p_;
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression(true);
    }
    expect_op("]");
    if (colons == 0) {
      auto it = make(Expr::Op::item, line);
      it->args.push_back(std::move(target));
      it->args.push_back(std::move(parts[0]));
      return it;
    }
    auto sl = make(Expr::Op::slice, line);
    sl->args.push_back(std::move(target));
    for (auto& part : parts) sl->args.push_back(std::move(part));
    return sl;
  }

  // ( args ) after a callee, a filter or a test: fills e's args (after
  // those already there) and kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().kind == Token::Kind::name && peek().kind == Token::Kind::op && peek().s == "=") {
        std::string key = t_[p_].s;
        p_ += 2;
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        e.args.push_back(parse_expression(true));
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(Expr::Op::call, cur().line);
    c->args.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      ++p_;
      n += "." + expect_name();
    }
    return n;
  }

  // | name(args) | name ... applied to input (null: a filter block's text).
  ExprPtr parse_filter_chain(ExprPtr input) {
    ExprPtr e = std::move(input);
    bool first = true;
    while (first || is_op("|")) {
      first = false;
      const int line = cur().line;
      ++p_;  // '|' or "filter"
      auto f = make(Expr::Op::filter, line);
      f->name = dotted_name();
      f->args.push_back(std::move(e));
      if (is_op("(")) parse_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        const int line = cur().line;
        ++p_;
        auto f = make(Expr::Op::filter, line);
        f->name = dotted_name();
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = cur().line;
        ++p_;
        auto t = make(Expr::Op::test, line);
        if (is_name("not")) {
          ++p_;
          t->negated = true;
        }
        t->name = dotted_name();
        t->args.push_back(std::move(e));
        const Token& c = cur();
        if (is_op("(")) {
          parse_args(*t);
        } else if ((c.kind == Token::Kind::name || c.kind == Token::Kind::string || c.kind == Token::Kind::integer ||
                    c.kind == Token::Kind::number || is_op("[") || is_op("{")) &&
                   !(c.kind == Token::Kind::name && (c.s == "else" || c.s == "or" || c.s == "and"))) {
          ExprPtr arg = parse_postfix(parse_primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse_template(std::string_view source, int max_depth) {
  Lexer lexer(normalize(source));
  Parser parser(lexer.run(), max_depth);
  return parser.parse_all();
}

}  // namespace phaselab::jinja
