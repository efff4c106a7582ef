// The serving benchmark's workload: its checks, the long requests' arrival
// times, and the prompts (generated or from a JSONL file).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "phaselab/serving_bench.h"
#include "phaselab/tokenizer.h"

namespace phaselab {

namespace {

// Ordinary words: most are one token of an English vocabulary (with the
// leading space), the rest a few; none is special to a chat template.
const char* const kWords[] = {
    "the",    "river",  "stone",   "garden", "window", "quiet",  "morning", "letter", "bridge", "summer",
    "winter", "forest", "silver",  "orange", "market", "little", "ancient", "number", "travel", "simple",
    "paper",  "music",  "island",  "mountain", "city",  "house",  "friend",  "answer", "question", "light",
    "water",  "green",  "yellow",  "table",  "chair",  "street", "people",  "history", "village", "harbor",
    "cloud",  "storm",  "evening", "bright", "open",   "small",  "large",   "early",  "late",   "warm",
    "cold",   "road",   "field",   "horse",  "bird",   "fish",   "apple",   "bread",  "cheese", "coffee",
    "school", "teacher", "student", "book",  "story",  "picture", "camera", "engine", "wheel",  "train",
    "station", "ticket", "journey", "north", "south",  "east",   "west",    "center", "corner", "circle",
    "square", "line",   "point",   "number", "count",  "measure", "weight", "height", "length", "color",
    "sound",  "voice",  "word",    "name",   "place",  "time",   "year",    "day",    "night",  "week",
    "month",  "hour",   "minute",  "second", "family", "mother", "father",  "child",  "brother", "sister",
    "doctor", "farmer", "baker",   "painter", "sailor", "king",  "queen",   "castle", "tower",  "wall",
    "door",   "key",    "lamp",    "candle", "fire",   "snow",   "rain",    "wind",   "sun",    "moon",
    "star",   "sky",    "sea",     "lake",   "hill",   "valley", "desert",  "ocean",  "shore",  "sand",
    "glass",  "metal",  "wood",    "cotton", "wool",   "gold",   "copper",  "iron",   "clock",  "bell",
    "song",   "dance",  "game",    "ball",   "kite",   "boat",   "ship",    "plane",  "car",    "bicycle",
};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// A seed of its own for each request: the same request gets the same
// prompt whatever else the run did.
uint64_t request_seed(uint64_t seed, ServingKind kind, int stream, int index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  for (uint64_t v : {static_cast<uint64_t>(kind) + 1, static_cast<uint64_t>(stream) + 1, static_cast<uint64_t>(index) + 1}) {
    x ^= v + 0x9E3779B97F4A7C15ull + (x << 6) + (x >> 2);
    x *= 0xBF58476D1CE4E5B9ull;
  }
  return x;
}

}  // namespace

const char* to_string(ServingKind k) { return k == ServingKind::chat ? "chat" : "long"; }

GenerateOptions serving_generate_options(const ServingWorkload& w, ServingKind kind) {
  GenerateOptions o;
  o.n_predict = kind == ServingKind::chat ? w.chat_answer : w.long_answer;
  o.ignore_eos = true;
  o.sampling.temperature = 0;
  o.sampling.seed = 0;
  return o;
}

Status validate_workload(const ServingWorkload& w) {
  const auto bad = [](const std::string& what) { return invalid_argument("serving workload: " + what); };
  if (w.streams < 0 || w.streams > 256) return bad("--streams must be 0 to 256");
  if (w.chat_prompt < 1 || w.chat_answer < 1) return bad("--chat-prompt and --chat-answer must be at least 1 token");
  if (w.long_prompt < 1 || w.long_answer < 1) return bad("--long-prompt and --long-answer must be at least 1 token");
  if (w.long_count < 0 || w.long_count > 10000) return bad("--long-count must be 0 to 10000");
  if (!(w.long_rate >= 0) || !std::isfinite(w.long_rate)) return bad("--long-rate must be 0 or more requests per second");
  if (!(w.long_start_s >= 0) || !(w.duration_s >= 0) || !std::isfinite(w.long_start_s) || !std::isfinite(w.duration_s))
    return bad("--long-start and --duration must be 0 or more seconds");
  if (w.streams == 0 && w.long_count == 0) return bad("nothing to run: give --streams or --long-count");
  return Status::ok();
}

std::vector<double> long_arrivals_s(const ServingWorkload& w) {
  std::vector<double> out;
  std::mt19937_64 rng(w.seed ^ 0x6C6F6E67ull);  // "long"
  std::exponential_distribution<double> gap(w.long_rate > 0 ? w.long_rate : 1.0);
  double t = w.long_start_s;
  for (int i = 0; i < w.long_count; i++) {
    if (i > 0 && w.long_rate > 0) t += gap(rng);
    out.push_back(t);
  }
  return out;
}

Result<std::vector<FilePrompt>> read_prompts_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return io_error("cannot open the prompts file '" + path + "' (a JSONL file: one {\"prompt\": \"...\"} a line)");
  std::vector<FilePrompt> out;
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto bad = [&](const std::string& why) {
      return invalid_argument(path + " line " + std::to_string(n) + ": " + why +
                              " (each line is {\"prompt\": \"...\"}, optionally with \"kind\": \"chat\" or \"long\")");
    };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("prompt") || !j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
      return bad("no \"prompt\" text");
    FilePrompt p;
    p.text = j["prompt"].get<std::string>();
    if (j.contains("kind")) {
      const std::string kind = j["kind"].is_string() ? j["kind"].get<std::string>() : "";
      if (kind == "long") p.kind = ServingKind::long_doc;
      else if (kind != "chat") return bad("\"kind\" must be \"chat\" or \"long\"");
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return invalid_argument("the prompts file '" + path + "' holds no prompt");
  return out;
}

PromptSource::PromptSource(const Tokenizer* tokenizer, ServingWorkload w, std::vector<FilePrompt> file)
    : tok_(tokenizer), w_(w) {
  for (FilePrompt& p : file) (p.kind == ServingKind::chat ? chat_file_ : long_file_).push_back(std::move(p));
}

PromptSource PromptSource::for_run(const ServingWorkload& run) const {
  PromptSource p = *this;
  p.w_.prompt_set = run.prompt_set;
  return p;
}

ServingPrompt PromptSource::prompt(ServingKind kind, int stream, int index) const {
  const auto& file = kind == ServingKind::chat ? chat_file_ : long_file_;
  if (file.empty()) return generated(kind, stream, index);
  // The file's prompts in request order: chat streams take turns.
  const size_t n = kind == ServingKind::chat ? static_cast<size_t>(index) * std::max(1, w_.streams) + stream
                                             : static_cast<size_t>(stream - w_.streams);
  ServingPrompt p;
  p.text = file[n % file.size()].text;
  if (tok_) p.tokens = tok_->encode(p.text, true, false);
  return p;
}

ServingPrompt PromptSource::generated(ServingKind kind, int stream, int index) const {
  const int n = kind == ServingKind::chat ? w_.chat_prompt : w_.long_prompt;
  std::mt19937_64 rng(request_seed(w_.seed ^ (static_cast<uint64_t>(w_.prompt_set) * 0xD1B54A32D192ED03ull), kind,
                                   stream, index));
  std::uniform_int_distribution<size_t> pick(0, kNumWords - 1);
  ServingPrompt p;
  const auto add_words = [&](int count) {
    for (int i = 0; i < count; i++) {
      if (!p.text.empty()) p.text += ' ';
      p.text += kWords[pick(rng)];
    }
  };
  if (!tok_) {  // n words, about a token each
    add_words(n);
    return p;
  }
  // Words until the text has enough tokens (a word is a token or more), then
  // the tokens are cut to n exactly and the text follows from them.
  do {
    add_words(std::max(8, (n - static_cast<int>(p.tokens.size())) / 2 + 1));
    p.tokens = tok_->encode(p.text, true, false);
  } while (static_cast<int>(p.tokens.size()) < n);
  p.tokens.resize(n);
  std::vector<int32_t> body = p.tokens;
  if (!body.empty() && tok_->add_bos() && body.front() == tok_->bos()) body.erase(body.begin());
  p.text = tok_->decode(body);
  return p;
}

}  // namespace phaselab
