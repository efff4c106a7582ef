// The Jinja interpreter against Python's jinja2 (tests/jinja/oracle.py, set up
// as Hugging Face transformers renders chat templates): every template of the
// corpus in tests/data/chat-templates on several conversations, and a list of
// snippets for each feature, must give the same text (or both an error). The
// sandbox's limits are checked here alone.
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QtTest>

#include <map>

#include <nlohmann/json.hpp>

#include "phaselab/jinja.h"
#include "phaselab/model.h"
#include "phaselab/prompt.h"
#include "tiny_model.h"

using nlohmann::ordered_json;
namespace jj = phaselab::jinja;

namespace {

constexpr std::time_t kNow = 1764720000;  // 2025-12-03 00:00 UTC: strftime_now's clock on both sides (local time)

struct Case {
  std::string label;
  std::string source;
  ordered_json context;
};

// A Python with jinja2: PHASELAB_PYTHON, else Debian's /usr/bin/python3
// (python3-jinja2, which scripts/install-deps.sh installs), else python3.
QString python_with_jinja2() {
  QStringList candidates;
  if (qEnvironmentVariableIsSet("PHASELAB_PYTHON")) candidates << qEnvironmentVariable("PHASELAB_PYTHON");
  candidates << "/usr/bin/python3" << "python3";
  for (const QString& py : candidates) {
    QProcess p;
    p.start(py, {"-c", "import jinja2"});
    if (p.waitForFinished(30000) && p.exitStatus() == QProcess::NormalExit && p.exitCode() == 0) return py;
  }
  return {};
}

// The oracle's results for the cases, in order.
std::vector<ordered_json> oracle(const std::vector<Case>& cases) {
  const QString py = python_with_jinja2();
  if (py.isEmpty()) {
    qWarning("no Python with jinja2: run scripts/install-deps.sh (Debian's python3-jinja2)");
    return {};
  }
  ordered_json spec;
  spec["now"] = kNow;
  spec["cases"] = ordered_json::array();
  for (const Case& c : cases) spec["cases"].push_back({{"template", c.source}, {"context", c.context}});
  QProcess p;
  p.start(py, {QStringLiteral(PHASELAB_TEST_SOURCE_DIR "/jinja/oracle.py")});
  p.waitForStarted();
  const std::string in = spec.dump();
  p.write(in.data(), static_cast<qint64>(in.size()));
  p.closeWriteChannel();
  if (!p.waitForFinished(300000) || p.exitCode() != 0) {
    qWarning("oracle failed: %s", p.readAllStandardError().constData());
    return {};
  }
  const QByteArray out = p.readAllStandardOutput();
  const ordered_json res = ordered_json::parse(out.constData(), out.constData() + out.size());
  return std::vector<ordered_json>(res.begin(), res.end());
}

struct Outcome {
  bool ok = false;
  std::string text;
};

Outcome ours(const Case& c) {
  jj::RenderOptions opts;
  opts.now = kNow;
  try {
    return {true, jj::render(c.source, c.context, opts)};
  } catch (const jj::Error& e) {
    return {false, e.what()};
  }
}

// Compares every case with the oracle; returns the mismatches, described.
QStringList mismatches(const std::vector<Case>& cases) {
  const auto expected = oracle(cases);
  if (expected.size() != cases.size()) return {"the oracle gave no answer (see the warning above)"};
  QStringList bad;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Outcome got = ours(cases[k]);
    const bool ok = expected[k].at("ok").get<bool>();
    if (ok != got.ok) {
      bad << QString::fromStdString(cases[k].label + ": jinja2 " +
                                    (ok ? "rendered" : "failed (" + expected[k].at("error").get<std::string>() + ")") +
                                    ", PhaseLab " + (got.ok ? "rendered" : "failed (" + got.text + ")"));
    } else if (ok && expected[k].at("text").get<std::string>() != got.text) {
      const std::string want = expected[k].at("text").get<std::string>();
      size_t at = 0;
      while (at < want.size() && at < got.text.size() && want[at] == got.text[at]) ++at;
      const size_t from = at > 40 ? at - 40 : 0;
      bad << QString::fromStdString(cases[k].label + ": differs at byte " + std::to_string(at) + "\n  jinja2:   " +
                                    ordered_json(want.substr(from, 120)).dump() + "\n  PhaseLab: " +
                                    ordered_json(got.text.substr(from, 120)).dump());
    }
  }
  return bad;
}

std::string read_file(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  return f.readAll().toStdString();
}

// One function offered to the model, in OpenAI's shape.
ordered_json tools() {
  return ordered_json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"},
          {"description", "The weather in a city."},
          {"parameters",
           {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}, {"description", "City name"}}}, {"unit", {{"type", "string"}, {"enum", {"c", "f"}}}}}},
            {"required", {"city"}}}}}}}});
}

ordered_json conversation(const std::string& kind) {
  using j = ordered_json;
  if (kind == "user") return j::array({{{"role", "user"}, {"content", "Hello! What is 2+2?"}}});
  if (kind == "system")
    return j::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name a colour."}}});
  if (kind == "multi")
    return j::array({{{"role", "user"}, {"content", "Hi"}},
                     {{"role", "assistant"}, {"content", "Hello, how can I help?"}},
                     {{"role", "user"}, {"content", "A joke about \"cats\" & dogs — ünïcode,\n  two lines."}}});
  if (kind == "parts")  // content as a list of typed parts, as OpenAI's API allows
    return j::array({{{"role", "system"}, {"content", j::array({{{"type", "text"}, {"text", "Sys part."}}})}},
                     {{"role", "user"}, {"content", j::array({{{"type", "text"}, {"text", "Part one."}},
                                                              {{"type", "text"}, {"text", "Part two."}}})}}});
  if (kind == "tools")  // a tool call and its result, with the tools offered
    return j::array(
        {{{"role", "user"}, {"content", "Weather in Paris?"}},
         {{"role", "assistant"},
          {"content", ""},
          {"tool_calls",
           j::array({{{"id", "call_1"},
                      {"type", "function"},
                      {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}, {"unit", "c"}}}}}}})}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"name", "get_weather"}, {"content", "{\"temp\": 21.5}"}},
         {{"role", "user"}, {"content", "Thanks."}}});
  // An assistant turn last, as when a template renders a whole saved chat.
  return j::array({{{"role", "system"}, {"content", "  Spaces around.  "}},
                   {{"role", "user"}, {"content", "Q1"}},
                   {{"role", "assistant"}, {"content", "A1"}},
                   {{"role", "user"}, {"content", "Q2"}},
                   {{"role", "assistant"}, {"content", "A2 {{ not code }}"}}});
}

}  // namespace

class TestJinja : public QObject {
  Q_OBJECT

 private slots:
  void corpus_renders_as_jinja2();
  void features_render_as_jinja2();
  void whitespace_control_renders_as_jinja2();
  void errors_are_errors();
  void sandbox_limits_hold();
  void model_template_renders_prompts();
  void tool_call_syntax_of_the_corpus();
};

// Which templates teach a call syntax PhaseLab parses (the probe of
// detect_tool_call_syntax): those writing {"name", "arguments"} JSON in
// <tool_call> blocks, gpt-oss's harmony, and Llama 3.x's reply of one bare
// {"name", "parameters"} object; every other template of the corpus none,
// among them those with <tool_call> and XML-like parameters inside
// (Qwen3-Coder, Qwen3.5, Nemotron 3, GLM-4.6), a JSON call in a role of its
// own (GigaChat 3) and [TOOL_CALLS] lists (Mistral).
void TestJinja::tool_call_syntax_of_the_corpus() {
  using phaselab::ToolCallSyntax;
  const std::map<std::string, ToolCallSyntax> want = {
      {"Bielik-11B-v3.0-Instruct.jinja", ToolCallSyntax::hermes},
      {"MiMo-VL.jinja", ToolCallSyntax::hermes},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolCallSyntax::hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolCallSyntax::hermes},
      {"Qwen-QwQ-32B.jinja", ToolCallSyntax::hermes},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallSyntax::hermes},
      {"Qwen-Qwen3-0.6B.jinja", ToolCallSyntax::hermes},
      {"Reka-Edge.jinja", ToolCallSyntax::hermes},
      {"ibm-granite-granite-4.0.jinja", ToolCallSyntax::hermes},
      {"ibm-granite-granite-4.1.jinja", ToolCallSyntax::hermes},
      {"openai-gpt-oss-120b.jinja", ToolCallSyntax::harmony},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallSyntax::json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolCallSyntax::json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolCallSyntax::json},
  };
  QDir dir(PHASELAB_TEST_DATA "/chat-templates");
  const QStringList files = dir.entryList({"*.jinja"}, QDir::Files, QDir::Name);
  QVERIFY(files.size() >= 60);
  for (const char* f : {"Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "GLM-4.6.jinja", "GigaChat3-10B-A1.8B.jinja",
                        "Mistral-Small-3.2-24B-Instruct-2506.jinja"})
    QVERIFY2(files.contains(QString::fromLatin1(f)), f);  // (the ones the comment names)
  for (const QString& f : files) {
    const phaselab::jinja::Template t(read_file(dir.filePath(f)));
    const auto it = want.find(f.toStdString());
    const ToolCallSyntax expected = it == want.end() ? ToolCallSyntax::none : it->second;
    QVERIFY2(phaselab::detect_tool_call_syntax(t) == expected, qPrintable(f));
  }
}

void TestJinja::corpus_renders_as_jinja2() {
  QDir dir(PHASELAB_TEST_DATA "/chat-templates");
  const QStringList files = dir.entryList({"*.jinja"}, QDir::Files, QDir::Name);
  QVERIFY2(files.size() >= 60, "the corpus of chat templates is missing (tests/data/chat-templates)");
  std::vector<Case> cases;
  for (const QString& f : files) {
    const std::string src = read_file(dir.filePath(f));
    QVERIFY(!src.empty());
    for (const char* conv : {"user", "system", "multi", "saved", "parts", "tools"})
      for (bool gen : {true, false}) {
        ordered_json ctx;
        ctx["messages"] = conversation(conv);
        ctx["add_generation_prompt"] = gen;
        ctx["bos_token"] = "<s>";
        ctx["eos_token"] = "</s>";
        if (std::string(conv) == "tools") ctx["tools"] = tools();
        cases.push_back({f.toStdString() + " [" + conv + (gen ? ", generation prompt]" : "]"), src, ctx});
      }
  }
  const QStringList bad = mismatches(cases);
  QVERIFY2(bad.isEmpty(), qPrintable(QString::number(bad.size()) + " of " + QString::number(cases.size()) +
                                     " cases differ:\n" + bad.mid(0, 12).join("\n")));
}

void TestJinja::features_render_as_jinja2() {
  const ordered_json ctx = {
      {"s", "  Hello World  "},
      {"n", 7},
      {"f", 2.5},
      {"xs", {3, 1, 2}},
      {"words", {"b", "A", "c", "a"}},
      {"d", {{"b", 2}, {"a", 1}, {"text", "t"}}},
      {"msgs", {{{"role", "user"}, {"content", "hi"}}, {{"role", "tool"}, {"content", "x"}}}},
      {"none", nullptr},
      {"t", true},
      {"big", 1e20},
      {"small", 0.00001},
      {"nested", {{"a", {1, 2.0, "x", nullptr, true}}, {"é", "ü\n\"q\""}}},
  };
  const char* snippets[] = {
      // literals, printing and operators
      "{{ 1 }} {{ 1.0 }} {{ 1.5e3 }} {{ -2 }} {{ 'a' 'b' }} {{ \"q\\\"\\n\" }} {{ none }} {{ t }} {{ [1, 'a', none] }}",
      "{{ {'k': 1, 'j': [1, 2]} }} {{ (1, 2) }} {{ big }} {{ small }} {{ f * 2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }}",
      "{{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }} {{ 1 + 2.5 }} {{ 7 % 2.5 }}",
      "{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' in 'cat' }} {{ 2 in xs }} {{ 'a' in d }} {{ 9 not in xs }} {{ 1 == 1.0 }} {{ t == 1 }}",
      "{{ not none }} {{ none or 'x' }} {{ 0 and 'y' }} {{ 'p' if n > 5 else 'q' }} {{ 'p' if n < 5 }}|",
      // strings
      "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}",
      "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ 'x\\ny'.splitlines() }}",
      "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.find('c') }}",
      "{{ '{} and {}'.format('x', 2) }} {{ '{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{{x}}'.format() }}",
      "{{ s[2:7] }} {{ s[::-1] }} {{ 'abc'[-1] }} {{ xs[1:] }} {{ xs[::2] }} {{ xs[-2:] }} {{ 'üñí'[1] }} {{ 'üñí'|length }}",
      "{{ '-'.join(['a', 'b']) }} {{ 'Hello'.capitalize() }} {{ 'hello world'.title() }} {{ 'ab'.removeprefix('a') }}",
      // filters
      "{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ s|length }}|{{ xs|length }}|{{ d|length }}|{{ undefined_thing|length }}",
      "{{ undefined_thing|default('dflt') }} {{ ''|default('e', true) }} {{ none|default('kept') }} {{ xs|first }} {{ xs|last }}",
      "{{ xs|join(', ') }} {{ msgs|map(attribute='role')|join('/') }} {{ words|sort }} {{ words|sort(case_sensitive=true) }}",
      "{{ xs|sort(reverse=true) }} {{ words|unique|list }} {{ xs|reverse|list }} {{ 'abc'|reverse }} {{ xs|min }} {{ xs|max }} {{ xs|sum }}",
      "{{ msgs|selectattr('role', 'equalto', 'user')|list }} {{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}",
      "{{ xs|select('odd')|list }} {{ xs|reject('even')|list }} {{ msgs|selectattr('content')|list|length }}",
      "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }} {{ d.items()|list }} {{ d.keys()|list }}",
      "{{ nested|tojson }} {{ nested|tojson(indent=2) }} {{ xs|tojson(separators=(',', ':')) }} {{ d|tojson(sort_keys=true) }} {{ nested|tojson(ensure_ascii=true) }} {{ 'a\U0001F600b'|tojson(true) }}",
      // markupsafe's Markup: a plain string added to a safe one is escaped
      "{{ 'a<'|safe + '<b>' }} {{ '<c>' + '&'|safe }} {{ ('x'|safe + '\"q\"')|trim }} {{ '<'|e + '>'|e }} {{ ('<'|safe).upper() + '&' }} {{ '<' ~ '>'|safe }} {{ '<'|e is escaped }}",
      "{{ 'a<b>&\"c\\''|e }} {{ '3'|int + 1 }} {{ 'x'|int }} {{ 2.7|int }} {{ '2.5'|float }} {{ 3|float }} {{ -3|abs }} {{ 2.567|round(2) }}",
      "{{ 'x\\ny\\n\\nz'|indent(2) }}|{{ 'x\\ny'|indent(2, true) }}|{{ 'x\\n\\ny'|indent(1, blank=true) }}|{{ 12|string ~ 'a' }}",
      "{{ 'hello world'|capitalize }} {{ 'hello world'|title }} {{ 'a b  c'|wordcount }} {{ xs|map('string')|join }} {{ d|attr('text') }}",
      // tests
      "{{ s is string }} {{ n is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }} {{ t is number }} {{ xs is iterable }}",
      "{{ d is mapping }} {{ xs is sequence }} {{ none is none }} {{ zz is defined }} {{ zz is undefined }} {{ zz is iterable }}",
      "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is eq 7 }} {{ n is ne 7 }} {{ 'ab' is lower }} {{ t is true }}",
      "{{ n is not none }} {{ xs is not string }} {{ 2 is in xs }} {{ s is sameas s }} {{ none is sameas none }} {{ range is callable }}",
      // statements
      "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
      "{% for x in xs %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }}{{ loop.cycle('a', 'b') }}{% endfor %}",
      "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}empty{% endfor %}{% for x in [] %}{% else %}none{% endfor %}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}",
      "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "{% set a = 1 %}{% for x in xs %}{% set a = a + x %}{{ a }}{% endfor %}|{{ a }}",
      "{% set ns = namespace(total=0, seen=[]) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }}",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set block %}in {{ n }}{% endset %}[{{ block }}]{% set up | upper %}x{% endset %}{{ up }}",
      "{% macro m(a, b='d', c=none) %}<{{ a }}{{ b }}{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m('x', b='y') }}",
      "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
      "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inside {{ n }}{% endcall %}",
      "{% filter upper %}shout {{ s }}{% endfilter %}{% if false %}no{% elif n == 7 %}seven{% else %}other{% endif %}",
      "{% generation %}gen {{ n }}{% endgeneration %}{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ none|map('upper')|list }} {{ none|selectattr('x')|list }} {{ dict(a=1) }} {{ strftime_now('%d %b %Y') }}",
      "{% for m in msgs %}{{ m['role'] }}:{{ m.content }}{{ m.missing }}|{% endfor %}{{ msgs[0].role }}{{ msgs[-1]['content'] }}",
      "{% if msgs[0]['role'] == 'system' %}{% set sys = msgs[0] %}{% set rest = msgs[1:] %}{% else %}{% set rest = msgs %}{% endif %}{{ rest|length }}",
      "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d['b'] }} {{ d.zz is defined }} {{ xs[9] is defined }}",
      "{# a comment #}a{#- trimmed -#}  b {{ n }}",
  };
  std::vector<Case> cases;
  int k = 0;
  for (const char* s : snippets) cases.push_back({"snippet " + std::to_string(k++) + ": " + s, s, ctx});
  const QStringList bad = mismatches(cases);
  QVERIFY2(bad.isEmpty(), qPrintable(bad.join("\n")));
}

void TestJinja::whitespace_control_renders_as_jinja2() {
  const ordered_json ctx = {{"xs", {1, 2}}, {"t", true}};
  const char* snippets[] = {
      "a\n{% if t %}\nyes\n{% endif %}\nb\n",
      "  {% if t %}\n  x\n  {% endif %}\n",
      "  {%+ if t %}x{% endif %}  \n",
      "{% for x in xs %}\n    {{ x }}\n{% endfor %}\n",
      "{% for x in xs -%}\n  {{ x }}  \n{%- endfor %}",
      "a   {{- 1 -}}   b  {{ 2 }}  \n  c",
      "line\n   {# comment #}\nnext\n\n",
      "x {%- if t %} y {% endif -%}\n\n z",
      "\t{% if t %}tab{% endif %}\r\nwindows\r\n{% if t %}\r\nCR{% endif %}\r\n",
      "{{ 'a' }}\n{{ 'b' }}\n",
      "{% if t %}a{% endif %}  {% if t %}b{% endif %}\n   {% if t %}c{% endif %}",
      "{%- set x = 1 -%}\n\n  {{ x }}\n\n",
  };
  std::vector<Case> cases;
  int k = 0;
  for (const char* s : snippets) cases.push_back({"whitespace " + std::to_string(k++) + ": " + ordered_json(s).dump(), s, ctx});
  const QStringList bad = mismatches(cases);
  QVERIFY2(bad.isEmpty(), qPrintable(bad.join("\n")));
}

void TestJinja::errors_are_errors() {
  // Both sides refuse these (the oracle is asked too, so no refusal here is
  // one that jinja2 would render).
  const ordered_json ctx = {{"xs", {1, 2}}, {"d", {{"a", 1}}}};
  const char* snippets[] = {
      "{{ raise_exception('System role not supported') }}",
      "{{ missing.attr }}",
      "{{ missing + 1 }}",
      "{{ 'a' + 1 }}",
      "{% if %}{% endif %}",
      "{% for x in xs %}",
      "{{ xs.append(3) }}",
      "{{ d.update({'b': 2}) }}",
      "{% set d.a = 2 %}",
      "{{ 1 / 0 }}",
      "{% endif %}",
      "{{ 'a' 'b' + }}",
      "{{ unknown_function() }}",
      "{{ xs|no_such_filter }}",
      "{{ 1 is no_such_test }}",
  };
  std::vector<Case> cases;
  int k = 0;
  for (const char* s : snippets) cases.push_back({"error " + std::to_string(k++) + ": " + s, s, ctx});
  const QStringList bad = mismatches(cases);
  QVERIFY2(bad.isEmpty(), qPrintable(bad.join("\n")));
  for (const Case& c : cases) QVERIFY2(!ours(c).ok, c.label.c_str());
  // raise_exception's message reaches the caller, with the line.
  try {
    jj::render("\n{{ raise_exception('System role not supported') }}", ordered_json::object());
    QFAIL("no error");
  } catch (const jj::Error& e) {
    QCOMPARE(QString(e.what()), QString("template line 2: System role not supported"));
  }
}

void TestJinja::sandbox_limits_hold() {
  jj::RenderOptions opts;
  opts.limits.max_steps = 200000;
  opts.limits.max_output = 1 << 16;
  opts.limits.max_depth = 64;
  auto refused = [&](const char* src, const char* why) {
    try {
      jj::render(src, ordered_json::object(), opts);
    } catch (const jj::Error& e) {
      return QString(e.what()).contains(why);
    }
    return false;
  };
  // Endless work, endless recursion, huge output and deep nesting end with an error.
  QVERIFY(refused("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"));
  QVERIFY(refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests deeper"));
  QVERIFY(refused("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", "larger than"));
  QVERIFY(refused("{{ 'x' * 100000000 }}", "output limit"));
  const std::string deep = std::string(500, '(') + "1" + std::string(500, ')');
  QVERIFY(refused(("{{ " + deep + " }}").c_str(), "nested too deeply"));
  // A wall-clock limit as well.
  jj::RenderOptions slow;
  slow.limits.max_seconds = 0.05;
  try {
    jj::render("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}", ordered_json::object(), slow);
    QFAIL("no error");
  } catch (const jj::Error& e) {
    QVERIFY2(QString(e.what()).contains("longer than"), e.what());
  }
  // Within the limits the same kind of template renders.
  QCOMPARE(QString::fromStdString(jj::render("{% for i in range(3) %}{{ i }}{% endfor %}", ordered_json::object(), opts)),
           QString("012"));
}

// A model's own template renders its chat prompts (render_prompt, as every
// front end calls it): the tokens are those of jinja2's text for the same
// template, one BOS where the template writes it too; a template that fails
// on a conversation falls back to the family, saying why; one that does not
// parse leaves the model loadable, with the family rendering.
void TestJinja::model_template_renders_prompts() {
  using namespace phaselab;
  const QString dir = PHASELAB_TEST_DATA "/chat-templates/";
  const std::string qwen = read_file(dir + "Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string llama = read_file(dir + "meta-llama-Llama-3.1-8B-Instruct.jinja");
  const std::string gemma2 = read_file(dir + "google-gemma-2-2b-it.jinja");
  QVERIFY(!qwen.empty() && !llama.empty() && !gemma2.empty());

  auto load = [](const std::string& tmpl, const char* file) {
    testing::TinySpec spec;
    spec.chat_template = tmpl;
    auto m = Model::load(testing::write_tiny_model(spec, file));
    if (!m) qFatal("%s", m.status().message().c_str());
    return *m;
  };
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "the cat sat"}};
  ordered_json messages = ordered_json::array();
  for (const auto& m : chat) messages.push_back({{"role", m.role}, {"content", m.content}});
  auto ctx_of = [&](const ordered_json& msgs) {
    return ordered_json{{"messages", msgs}, {"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  };

  // Qwen 2.5 (ChatML, no BOS written) and Llama 3.1 (writes bos_token first).
  const auto expected = oracle({{"qwen", qwen, ctx_of(messages)}, {"llama", llama, ctx_of(messages)}});
  QCOMPARE(expected.size(), size_t(2));
  int k = 0;
  for (const auto& [tmpl, family] : {std::pair{qwen, ChatTemplateFamily::chatml}, std::pair{llama, ChatTemplateFamily::llama3}}) {
    auto model = load(tmpl, k == 0 ? "jinja-qwen.gguf" : "jinja-llama.gguf");
    const ChatFormat format = model->chat_format();
    // Qwen 2.5's template teaches <tool_call>; Llama 3.1's a bare JSON reply.
    QCOMPARE(format.tool_calls, family == ChatTemplateFamily::chatml ? ToolCallSyntax::hermes : ToolCallSyntax::json);
    QVERIFY(format.jinja != nullptr);
    QVERIFY(model->chat_template_error().empty());
    QCOMPARE(format.family, family);
    QCOMPARE(format.bos_token, std::string("<s>"));
    QCOMPARE(format.eos_token, std::string("</s>"));
    const RenderedPrompt p = render_prompt(model->tokenizer(), format, PromptInput::chat_of(chat));
    QVERIFY(p.from_template);
    QVERIFY(p.template_fallback.empty());
    std::string text = expected[static_cast<size_t>(k)].at("text").get<std::string>();
    if (k == 1) {
      QVERIFY(text.rfind("<s>", 0) == 0);  // Llama 3.1 writes the BOS text itself
      text.erase(0, 3);
    }
    QCOMPARE(p.tokens, model->tokenizer().encode(text, true, true));
    QCOMPARE(std::count(p.tokens.begin(), p.tokens.end(), model->tokenizer().bos()), 1);
    QCOMPARE(p.stop, chat_stop_strings(family));
    // A family chosen instead renders as before.
    const RenderedPrompt chosen = render_prompt(model->tokenizer(), ChatFormat(ChatTemplateFamily::plain), PromptInput::chat_of(chat));
    QVERIFY(!chosen.from_template);
    QCOMPARE(chosen.tokens, model->tokenizer().encode(apply_chat_template(ChatTemplateFamily::plain, chat), true, true));
    ++k;
  }

  // Gemma 2's template refuses a system turn: the built-in gemma format
  // renders that conversation, and the reason is kept.
  {
    auto model = load(gemma2, "jinja-gemma2.gguf");
    const RenderedPrompt p = render_prompt(model->tokenizer(), model->chat_format(), PromptInput::chat_of(chat));
    QVERIFY(!p.from_template);
    QVERIFY2(p.template_fallback.find("System role not supported") != std::string::npos, p.template_fallback.c_str());
    QCOMPARE(p.tokens, model->tokenizer().encode(apply_chat_template(ChatTemplateFamily::gemma, chat), true, true));
    // Without the system turn its own template renders.
    const RenderedPrompt q = render_prompt(model->tokenizer(), model->chat_format(), PromptInput::chat_of({chat[1]}));
    QVERIFY(q.from_template);
  }

  // A template that does not parse: the model loads, says why, and the
  // family renders.
  {
    auto model = load("<|im_start|>{% for m in messages %}{{ m.content }", "jinja-broken.gguf");
    QVERIFY(!model->chat_template_error().empty());
    QVERIFY(model->chat_format().jinja == nullptr);
    const RenderedPrompt p = render_prompt(model->tokenizer(), model->chat_format(), PromptInput::chat_of(chat));
    QVERIFY(!p.from_template);
    QCOMPARE(p.tokens, model->tokenizer().encode(apply_chat_template(ChatTemplateFamily::chatml, chat), true, true));
  }
}

QTEST_GUILESS_MAIN(TestJinja)
#include "test_jinja.moc"
