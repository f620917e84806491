// A call's note as a real rank's observer writes it on its note link: one line,
// "group\ttag\tkind\tnumel\tdtype\n" (neuronabox/observer/sizes.py). The core reads these
// itself, so a noted ring can start before the call's first frame with no Python turn
// between (book_bindings.cc, the note links).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nbx {

constexpr size_t kNoteLineMax = 512;  // a longer line is no note (a group name is at most ~100 bytes)

struct NoteLine {
  std::string group;
  uint64_t tag = 0;
  std::string kind;  // the c10d function: all_reduce, reduce
  uint64_t numel = 0;
  std::string dtype;  // as c10 names it: Float, BFloat16, ...

  // What a note id stands for: the shape told, in its group (Core.know_note).
  std::string shape_key() const { return group + '\t' + kind + '\t' + std::to_string(numel) + '\t' + dtype; }
};

// One line without its newline; false: not a note (a field missing, empty or not a number).
bool parse_note_line(std::string_view line, NoteLine* out);

}  // namespace nbx
