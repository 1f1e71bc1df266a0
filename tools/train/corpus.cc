#include "tools/train/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dtr::train {
namespace {

// splitmix64 (Steele, Lea and Flood, 2014): a 64-bit state and explicit integer
// arithmetic, so a seed gives the same draws on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // In [0, n) for n >= 1 (the modulo bias is negligible for the small n used here).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // In [lo, hi], both included.
  int64_t between(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  bool percent(int64_t p) { return below(100) < p; }
  std::string_view pick(std::span<const std::string_view> words) {
    return words[static_cast<size_t>(below(static_cast<int64_t>(words.size())))];
  }
  // k distinct indices of [0, n), in random order (a partial Fisher-Yates shuffle).
  std::vector<int64_t> distinct(int64_t n, int64_t k) {
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
    for (int64_t i = 0; i < k; ++i) std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(between(i, n - 1))]);
    all.resize(static_cast<size_t>(k));
    return all;
  }

 private:
  uint64_t state_;
};

// The word lists: small on purpose, so that words recur and their contexts can be learnt.
constexpr std::string_view kGirls[] = {"Anna", "Mia", "Lena", "Rosa", "Ida", "Nora", "Eva", "Tara", "Lily", "June"};
constexpr std::string_view kBoys[] = {"Tom", "Ben", "Max", "Leo", "Sam", "Otto", "Finn", "Paul", "Omar", "Hugo"};
constexpr std::string_view kRoles[] = {"farmer", "baker", "painter", "sailor", "teacher", "singer", "tailor", "fisher"};
constexpr std::string_view kTraits[] = {"kind", "brave", "quiet", "curious", "clever", "shy", "cheerful", "busy"};
constexpr std::string_view kPlaces[] = {"the forest",  "the market", "the old mill", "the river",
                                        "the school",  "the harbor", "the garden",   "the hill",
                                        "the library", "the bakery", "the farm",     "the bridge"};
constexpr std::string_view kSpots[] = {"under a tree", "next to a wall", "in the grass",      "behind a door",
                                       "on a bench",   "near the water", "inside an old boot"};
constexpr std::string_view kObjects[] = {"key",   "ball",  "hat",  "book", "lamp", "cup",  "kite",
                                         "stone", "shell", "coin", "bell", "map",  "ring", "apple"};
constexpr std::string_view kColors[] = {"red",   "blue",  "green",  "yellow", "white",
                                        "black", "brown", "purple", "gray",   "pink"};
constexpr std::string_view kSizes[] = {"small", "big", "heavy", "light"};
constexpr std::string_view kLooks[] = {"old", "shiny", "dusty", "new", "smooth"};
constexpr std::string_view kWeather[] = {"sunny", "cold", "rainy", "quiet", "windy", "bright", "foggy"};
constexpr std::string_view kAnimals[] = {"dog", "cat", "bird", "fox", "goat", "duck"};
constexpr std::string_view kFeelings[] = {"happy", "tired", "glad", "proud", "calm", "sleepy"};
constexpr std::string_view kContainers[] = {"box",    "cup", "bag", "jar",  "chest", "basket",
                                            "drawer", "pot", "tin", "sack", "crate", "bowl"};
constexpr std::string_view kTowns[] = {"the north", "the old town", "the valley",           "the city",
                                       "the hills", "the port",     "a village by the lake"};

struct Person {
  std::string_view name, he, him, his;  // "she", "her", "her" for a girl
};

Person pick_person(Rng& rng) {
  if (rng.percent(50)) return {rng.pick(kGirls), "she", "her", "her"};
  return {rng.pick(kBoys), "he", "him", "his"};
}

// A second person whose name differs from `other`'s.
Person pick_other_person(Rng& rng, const Person& other) {
  Person p = pick_person(rng);
  while (p.name == other.name) p = pick_person(rng);
  return p;
}

// A paragraph built one sentence at a time: sentences are joined by a space, and each
// starts with a capital letter (after an opening quote, if it has one).
class Paragraph {
 public:
  template <class... Parts>
  void say(const Parts&... parts) {
    if (!text_.empty()) text_ += ' ';
    const size_t start = text_.size();
    (text_.append(std::string_view(parts)), ...);
    size_t first = start < text_.size() && text_[start] == '"' ? start + 1 : start;
    if (first < text_.size() && text_[first] >= 'a' && text_[first] <= 'z') text_[first] = text_[first] - 'a' + 'A';
  }
  // A new line inside the paragraph (for arithmetic and lists, one item a line).
  template <class... Parts>
  void line(const Parts&... parts) {
    if (!text_.empty()) text_ += '\n';
    (text_.append(std::string_view(parts)), ...);
  }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

std::string story(Rng& rng) {
  const Person hero = pick_person(rng);
  const Person pal = pick_other_person(rng, hero);
  const std::vector<int64_t> places = rng.distinct(std::size(kPlaces), 2);
  const std::string_view place = kPlaces[places[0]], place2 = kPlaces[places[1]];
  const std::string_view color = rng.pick(kColors), object = rng.pick(kObjects);
  const std::string_view role = rng.percent(40) ? (hero.he == "she" ? "girl" : "boy") : rng.pick(kRoles);
  const std::string_view trait = rng.pick(kTraits);
  Paragraph p;
  switch (rng.below(3)) {
    case 0: p.say("once upon a time there was a ", trait, " ", role, " named ", hero.name, "."); break;
    case 1: p.say(hero.name, " was a ", trait, " ", role, " who lived near ", place, "."); break;
    default: p.say("there once lived a ", trait, " ", role, " called ", hero.name, "."); break;
  }
  p.say("one ", rng.pick(kWeather), " morning, ", hero.he, " walked to ", place, ".");
  p.say("there ", hero.he, " found a ", color, " ", object, " ", rng.pick(kSpots), ".");
  if (rng.percent(50)) {
    const std::string_view size = rng.pick(kSizes);  // one draw per statement: argument order is unspecified
    p.say("the ", object, " was ", size, " and ", rng.pick(kLooks), ".");
  }
  p.say(hero.he, " took the ", object, " to ", hero.his, " friend ", pal.name, ".");
  switch (rng.below(3)) {
    case 0: p.say(pal.name, " said, \"I like your ", color, " ", object, ", ", hero.name, ".\""); break;
    case 1:
      p.say("\"Where did you find it?\" asked ", pal.name, ".");
      p.say("\"at ", place, ",\" said ", hero.name, ".");
      break;
    default: p.say(pal.name, " looked at the ", object, " and smiled at ", hero.name, "."); break;
  }
  if (rng.percent(40)) {
    const std::string_view animal = rng.pick(kAnimals);
    p.say("on the way they met a ", animal, ".");
    p.say("the ", animal, " wanted the ", object, ", but ", hero.name, " held it tight.");
  }
  bool pal_has_it = false;
  switch (rng.below(3)) {
    case 0: p.say("then ", hero.name, " and ", pal.name, " went to ", place2, " together."); break;
    case 1: p.say(hero.name, " and ", pal.name, " played with the ", object, " until it was dark."); break;
    default:
      p.say("later ", hero.name, " gave the ", object, " to ", pal.name, ", and ", pal.he, " kept it safe.");
      p.say(pal.name, " thanked ", hero.him, ".");
      pal_has_it = true;
      break;
  }
  const std::string_view feeling = rng.pick(kFeelings);
  if (pal_has_it) {
    p.say("at night ", hero.name, " went home without the ", object, ".");
    p.say(hero.he, " felt ", feeling, " all the same.");
  } else if (rng.percent(50)) {
    p.say("at night ", hero.name, " put the ", object, " on ", hero.his, " shelf.");
    p.say(hero.he, " felt ", feeling, ".");
  } else {
    p.say("when ", hero.he, " came home, ", hero.name, " was ", feeling, ".");
  }
  if (rng.percent(40)) {
    p.say("who found the ", object, "? ", hero.name, ".");
    p.say("where did ", hero.he, " find it?");
    p.say("at ", place, ".");
    p.say("what color was the ", object, "?");
    p.say(color, ".");
    if (pal_has_it) p.say("who has the ", object, " now? ", pal.name, ".");
  }
  return p.take();
}

// Facts stated, then some of them asked back in a different order.
std::string facts(Rng& rng) {
  struct Fact {
    std::string statement, question, answer;
  };
  std::vector<Fact> all;
  const int64_t boxes = rng.between(2, 4);
  const std::vector<int64_t> which = rng.distinct(std::size(kContainers), boxes);
  const std::vector<int64_t> things = rng.distinct(std::size(kObjects), boxes);
  for (int64_t i = 0; i < boxes; ++i) {
    const std::string box(kContainers[which[i]]);
    const std::string thing = std::string(rng.pick(kColors)) + " " + std::string(kObjects[things[i]]);
    if (rng.percent(50)) {
      all.push_back({"the " + box + " holds a " + thing + ".", "what does the " + box + " hold?", "a " + thing + "."});
    } else {
      all.push_back(
          {"in the " + box + " there is a " + thing + ".", "what is in the " + box + "?", "a " + thing + "."});
    }
  }
  const int64_t people = rng.between(0, 2);
  Person previous{};
  for (int64_t i = 0; i < people; ++i) {
    const Person who = i == 0 ? pick_person(rng) : pick_other_person(rng, previous);
    const std::string name(who.name);
    if (rng.percent(50)) {
      const std::string town(rng.pick(kTowns));
      all.push_back({name + " lives in " + town + ".", "where does " + name + " live?", "in " + town + "."});
    } else {
      const std::string age = std::to_string(rng.between(3, 90));
      all.push_back({name + " is " + age + " years old.", "how old is " + name + "?", age + "."});
    }
    previous = who;
  }
  Paragraph p;
  for (const Fact& f : all) p.say(f.statement);
  const auto n = static_cast<int64_t>(all.size());
  for (int64_t i : rng.distinct(n, rng.between(2, n))) {
    p.say(all[static_cast<size_t>(i)].question);
    p.say(all[static_cast<size_t>(i)].answer);
  }
  return p.take();
}

// "a + b = c." lines, all correct: sums and differences of numbers below 100 (never
// negative), and products of numbers up to 12.
std::string arithmetic(Rng& rng) {
  Paragraph p;
  for (int64_t lines = rng.between(3, 8); lines > 0; --lines) {
    switch (rng.below(3)) {
      case 0: {
        const int64_t a = rng.below(100), b = rng.below(100);
        p.line(std::to_string(a), " + ", std::to_string(b), " = ", std::to_string(a + b), ".");
        break;
      }
      case 1: {
        const int64_t a = rng.below(100), b = rng.between(0, a);
        p.line(std::to_string(a), " - ", std::to_string(b), " = ", std::to_string(a - b), ".");
        break;
      }
      default: {
        const int64_t a = rng.between(0, 12), b = rng.between(0, 12);
        p.line(std::to_string(a), " * ", std::to_string(b), " = ", std::to_string(a * b), ".");
        break;
      }
    }
  }
  return p.take();
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : " ") + s;
  return out;
}

// Sequences with a rule: counting up and down, steps, sorting and reversing.
std::string lists(Rng& rng) {
  Paragraph p;
  for (int64_t lines = rng.between(2, 4); lines > 0; --lines) {
    std::vector<std::string> items;
    switch (rng.below(6)) {
      case 0: {
        const int64_t start = rng.below(91), n = rng.between(4, 10);
        for (int64_t i = 0; i < n; ++i) items.push_back(std::to_string(start + i));
        p.line("Count: ", joined(items), ".");
        break;
      }
      case 1: {
        const int64_t start = rng.between(10, 99), n = rng.between(4, 10);
        for (int64_t i = 0; i < n; ++i) items.push_back(std::to_string(start - i));
        p.line("Count down: ", joined(items), ".");
        break;
      }
      case 2: {
        const int64_t step = rng.between(2, 9), start = rng.below(21), n = rng.between(4, 8);
        for (int64_t i = 0; i < n; ++i) items.push_back(std::to_string(start + i * step));
        p.line("Step ", std::to_string(step), ": ", joined(items), ".");
        break;
      }
      case 3: {
        std::vector<int64_t> values(static_cast<size_t>(rng.between(3, 6)));
        for (int64_t& v : values) v = rng.below(50);
        for (int64_t v : values) items.push_back(std::to_string(v));
        const std::string given = joined(items);
        std::sort(values.begin(), values.end());
        items.clear();
        for (int64_t v : values) items.push_back(std::to_string(v));
        p.line("Sort ", given, ": ", joined(items), ".");
        break;
      }
      case 4: {
        const int64_t n = rng.between(4, 8), start = rng.below(26 - n + 1);
        for (int64_t i = 0; i < n; ++i) items.push_back(std::string(1, static_cast<char>('a' + start + i)));
        p.line("Letters: ", joined(items), ".");
        break;
      }
      default: {
        for (int64_t n = rng.between(3, 6); n > 0; --n)
          items.push_back(std::string(1, static_cast<char>('a' + rng.below(26))));
        const std::string given = joined(items);
        std::reverse(items.begin(), items.end());
        p.line("Reverse ", given, ": ", joined(items), ".");
        break;
      }
    }
  }
  return p.take();
}

// The cut nearest to `target` that falls just after an occurrence of `sep` and leaves
// both sides non-empty; npos when there is none.
size_t nearest_cut(const std::string& text, size_t target, std::string_view sep) {
  const size_t n = text.size();
  size_t best = std::string::npos;
  const auto consider = [&](size_t cut) {
    if (cut < 1 || cut > n - 1) return;
    const auto distance = [&](size_t c) { return c > target ? c - target : target - c; };
    if (best == std::string::npos || distance(cut) < distance(best)) best = cut;
  };
  if (target >= sep.size()) {
    const size_t before = text.rfind(sep, target - sep.size());
    if (before != std::string::npos) consider(before + sep.size());
  }
  const size_t after = text.find(sep, target + 1 > sep.size() ? target + 1 - sep.size() : 0);
  if (after != std::string::npos) consider(after + sep.size());
  return best;
}

}  // namespace

std::string builtin_corpus(int64_t bytes, uint64_t seed) {
  DTR_CHECK(bytes >= 1, ValueError, "builtin_corpus: bytes must be at least 1, got {}", bytes);
  Rng rng(seed);
  std::string text;
  text.reserve(static_cast<size_t>(bytes) + 2048);
  while (static_cast<int64_t>(text.size()) < bytes) {
    if (!text.empty()) text += '\n';     // the blank line between paragraphs
    const int64_t kind = rng.below(20);  // 40% stories, 25% facts, 15% arithmetic, 20% lists
    text += kind < 8 ? story(rng) : kind < 13 ? facts(rng) : kind < 16 ? arithmetic(rng) : lists(rng);
    text += '\n';
  }
  return text;
}

CorpusSplit split_corpus(const std::string& text, double val_fraction) {
  DTR_CHECK(val_fraction > 0 && val_fraction < 1, ValueError, "split_corpus: val_fraction must be in (0, 1), got {}",
            val_fraction);
  const size_t n = text.size();
  DTR_CHECK(n >= 2, ValueError, "split_corpus: a text of {} bytes cannot be cut into two non-empty parts", n);
  const auto val_bytes = static_cast<size_t>(std::llround(val_fraction * static_cast<double>(n)));
  const size_t target = std::clamp<size_t>(n - std::min(val_bytes, n), 1, n - 1);
  size_t cut = nearest_cut(text, target, "\n\n");
  if (cut == std::string::npos) cut = nearest_cut(text, target, "\n");
  if (cut == std::string::npos) cut = target;
  return {text.substr(0, cut), text.substr(cut)};
}

}  // namespace dtr::train
