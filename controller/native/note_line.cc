#include "note_line.h"

#include <charconv>

namespace nbx {

namespace {

bool number(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

bool parse_note_line(std::string_view line, NoteLine* out) {
  std::string_view fields[5];
  size_t n = 0;
  bool more = true;
  while (more && n < 5) {
    const size_t tab = line.find('\t');
    fields[n++] = line.substr(0, tab);
    more = tab != std::string_view::npos;
    if (more) line.remove_prefix(tab + 1);
  }
  if (n != 5 || more) return false;  // fewer fields, or a sixth
  if (fields[0].empty() || fields[2].empty() || fields[4].empty()) return false;
  if (!number(fields[1], &out->tag) || !number(fields[3], &out->numel)) return false;
  out->group.assign(fields[0]);
  out->kind.assign(fields[2]);
  out->dtype.assign(fields[4]);
  return true;
}

}  // namespace nbx
