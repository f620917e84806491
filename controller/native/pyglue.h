// What the two binding files share: the pair's Python object (with the routes that
// hand its events to collective books natively) and the payload wrappers.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bytes.h"
#include "gloo_pair.h"

namespace nbx::py {

// Events of `slot` on this pair go to `book`'s pair `index`, natively.
struct Route {
  uint64_t slot;
  PyObject* book;  // borrowed: the book removes its routes before it goes
  size_t index;
};

// The slots a pair remembers handing to Python (its frames no book took).
constexpr uint32_t kHandedKept = 32;

struct PairObject {
  PyObject_HEAD
  gloo::Pair* pair;
  int fd;                      // the socket, once the driver has one (-1: none; frames are taken)
  std::vector<Route>* routes;  // books that take this pair's events natively
  PyObject* starts;            // borrowed: the Core that may start a book for a first frame here (null: none)
  // The last distinct slots whose frames went to Python: Python owns those instances, so
  // no core starts a book for one (its routes would take frames whose notices Python has).
  uint64_t handed[kHandedKept];
  uint32_t handed_n;  // slots recorded so far (the ring holds the last kHandedKept)
  // The latest collective tag in this real rank's frames on its group's pairs (-1: none
  // yet), shared by those pairs (Core.watch): a note whose tag is the next one names its
  // call truly, and may start it before any frame (the note links). Null: not watched.
  std::shared_ptr<int64_t>* last_tag;
};

// Moves a scope's latest collective tag on to `slot`'s, if the slot is a collective's
// (Gloo's: prefix << 56 | tag << 24 | delta, prefixes 1 to 8) and its tag is later.
void advance_tag(int64_t* last, uint64_t slot);

extern PyTypeObject PairType;
extern PyObject* g_wire_error;
extern PyTypeObject* g_recv_ready;  // the dialect's event types (bind())
extern PyTypeObject* g_send_ready;
extern PyTypeObject* g_data;

PyObject* events_to_list(std::vector<gloo::Event>& events);

PyObject* payload_wrap(BytesRef ref);
bool as_bytes_ref(PyObject* obj, BytesRef* out);

// Hands `events` to the books routed for their slots; returns those no book takes, as
// the dialect's Python events (nullptr with a Python error set on failure).
PyObject* dispatch(PairObject* pair, std::vector<gloo::Event>& events, double now);
// The same, natively: the events no book takes go to `rest`; false with a Python error set.
bool route(PairObject* pair, std::vector<gloo::Event>& events, double now, std::vector<gloo::Event>* rest);

// Receives what the socket has for the pair and dispatches it, stamped `now`: the events
// no book takes, None once the socket closed, nullptr with a Python error set.
PyObject* read_pair(PairObject* pair, int fd, double now);

// A Python error is set: unwinds through native code to the binding that returns it.
struct PyErrorSet {};

// A native class of the module: what its type object needs, then added by its name.
struct TypeSpec {
  const char* name;  // the class name in the module
  Py_ssize_t size;
  destructor dealloc;
  const char* doc;
  initproc init;
  PyMethodDef* methods = nullptr;
  PyGetSetDef* getset = nullptr;
  traverseproc traverse = nullptr;  // with clear: the collector sees what it holds
  inquiry clear = nullptr;
};
// Readies `type` from `spec` and adds it to `module`; false with a Python error set.
bool add_type(PyObject* module, PyTypeObject* type, const TypeSpec& spec);

// Registers Book and Core in the module.
int add_book_types(PyObject* module);

// Where a Core hands what a live run's loop does itself (release timers, writes to a
// pair with no socket) when time is virtual: the virtual-time driver (virtual_wire.cc).
class CoreSink {
 public:
  virtual ~CoreSink() = default;
  // A book's release timer for `pair`, due at `when` (`book` borrowed).
  virtual void timer(double when, PyObject* book, size_t pair) = 0;
  // Frames are queued on `pair` (conn.pair); false with a Python error set.
  virtual bool emit(PyObject* conn, PairObject* pair) = 0;
};

// A schedule's message (a Msg: (peer, step, nbytes)) whose length is known (>= 0); false
// with a Python error set that says which.
bool parse_msg(PyObject* m, int64_t* peer, int64_t* step, int64_t* nbytes);

// `core` (a Core) hands its timers and writes to `sink` (nullptr: back to its hooks);
// false with a Python error set when `core` is not a Core.
bool set_core_sink(PyObject* core, CoreSink* sink);

// A book's release timer fired at `now`: as Book.due, from native code. False with a
// Python error set.
bool book_due_at(PyObject* book, size_t pair, double now);

// Registers the virtual-time driver's types (virtual_wire.cc).
int add_virtual_types(PyObject* module);

}  // namespace nbx::py
