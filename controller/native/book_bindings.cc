// Python bindings of the collective book (book.h): `Book`, one instance's boundary
// bookkeeping, and `Core`, the host its actions go to.
//
// Once a book is connected to its pairs, the pairs' reads hand it their frames
// natively (`dispatch`): a ring step's notices and payloads are matched, the sends
// they free are priced and queued, and the pair's socket is written, with no Python
// in between. The Core runs the release timers natively for a live run, or hands them
// to a Python `call_at` (the virtual-time driver); frames for a pair with no socket,
// writes the socket could not take whole, and finished instances go to Python hooks.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <deque>
#include <iterator>
#include <limits>
#include <new>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "book.h"
#include "note_line.h"
#include "pyglue.h"
#include "timing_api.h"

namespace nbx::py {
namespace {

PyObject* g_protocol_error = nullptr;

// A strong reference to a Python object, dropped with its holder (books are freed
// with the GIL held).
class PyRef {
 public:
  explicit PyRef(PyObject* obj) : obj_(obj) { Py_INCREF(obj_); }
  ~PyRef() { Py_DECREF(obj_); }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyObject* get() const { return obj_; }

  // Calls with Py_BuildValue's `format`; the result (never null: a Python error throws).
  template <typename... A>
  PyObject* call(const char* format, A... args) const {
    PyObject* r = PyObject_CallFunction(obj_, format, args...);
    if (r == nullptr) throw PyErrorSet();
    return r;
  }

 private:
  PyObject* obj_;
};

// The instance's timeline (the schedules' timing model), asked through its Python
// methods: native timelines answer those in C++, and a release is asked once per message.
class PyClock final : public ReleaseClock {
 public:
  PyClock(PyObject* release, PyObject* real_sent) : release_(release), sent_(real_sent) {}

  double release(int64_t emu, int64_t step) override {
    PyObject* r = release_.call("LL", static_cast<long long>(emu), static_cast<long long>(step));
    const double t = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (t == -1.0 && PyErr_Occurred()) throw PyErrorSet();
    return t;
  }

  void real_sent(int64_t real, int64_t step, double t) override {
    Py_DECREF(sent_.call("LLd", static_cast<long long>(real), static_cast<long long>(step), t));
  }

 private:
  PyRef release_, sent_;  // the bound methods
};

// A native timeline (neuronabox/schedules/native/timing_api.h), asked with no Python
// in between; the object is held for as long as the book.
class NativeClock final : public ReleaseClock {
 public:
  NativeClock(PyObject* timeline, const timing::TimingApi* api, void* tl, int kind)
      : obj_(timeline), api_(api), tl_(tl), kind_(kind) {}

  double release(int64_t emu, int64_t step) override {
    return api_->release(tl_, kind_, static_cast<int>(emu), static_cast<int>(step));
  }
  void real_sent(int64_t real, int64_t step, double t) override {
    api_->real_sent(tl_, kind_, static_cast<int>(real), static_cast<int>(step), t);
  }

 private:
  PyRef obj_;
  const timing::TimingApi* api_;
  void* tl_;
  int kind_;
};

// The timing module's C API, imported once (null: not there, and Python calls serve).
const timing::TimingApi* timing_api() {
  static const timing::TimingApi* api = [] {
    auto* p = static_cast<const timing::TimingApi*>(PyCapsule_Import(timing::kTimingApiCapsule, 0));
    if (p == nullptr || p->version != timing::kTimingApiVersion) {
      PyErr_Clear();
      return static_cast<const timing::TimingApi*>(nullptr);
    }
    return p;
  }();
  return api;
}

// An emulated send's bytes from Python (`payload(pair, step, nbytes)`: bytes-like, or
// None for the book's own rule).
class PySource final : public PayloadSource {
 public:
  explicit PySource(PyObject* fn) : fn_(fn) {}

  BytesRef payload(size_t pair, int64_t step, int64_t nbytes) override {
    PyObject* r = fn_.call("nLL", static_cast<Py_ssize_t>(pair), static_cast<long long>(step),
                           static_cast<long long>(nbytes));
    BytesRef ref;
    const bool ok = r == Py_None || as_bytes_ref(r, &ref);
    Py_DECREF(r);
    if (!ok) throw PyErrorSet();
    return ref;
  }

 private:
  PyRef fn_;
};

// A program that grows from Python (`extend(pair, send) -> bool`).
class PyExtension final : public ProgramExtension {
 public:
  explicit PyExtension(PyObject* fn) : fn_(fn) {}

  bool extend(size_t pair, bool send) override {
    PyObject* r = fn_.call("nO", static_cast<Py_ssize_t>(pair), send ? Py_True : Py_False);
    const int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (yes < 0) throw PyErrorSet();
    return yes == 1;
  }

 private:
  PyRef fn_;
};

struct Timer {
  double at;
  uint64_t seq;
  PyObject* book;  // strong
  size_t pair;
  bool operator>(const Timer& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

// A pair socket the core's loop reads.
struct Watched {
  PyObject* conn;  // strong
  PairObject* pair;  // strong
  std::string label;  // names the pair in a wire error
  bool writing;  // EPOLLOUT is on: frames wait for the socket
};

// A native start: a collective whose schedule its first frame on `pair` settles, seen once
// in Python (engine.py, StartTemplate). A later instance whose first frame matches gets its
// book here, loaded with the recorded program and connected before the frame goes in, so
// no Python runs before its messages flow; Python adopts it at the loop's next idle turn
// (Core.take_started).
struct Starter {
  PairObject* pair;         // strong: where the first frame comes
  size_t index;             // that pair's index in the program
  uint64_t mask, value;     // slot & mask == value: the collective's kind (and sub-slot)
  // The first frames, in order: notices of these kinds and lengths (more than one: the
  // program has one pair, so they all come on it, and they wait in a Pending until matched).
  std::vector<std::pair<gloo::EventKind, uint64_t>> frames;
  int tag_shift;            // the instance's tag: (slot >> tag_shift) & tag_mask
  uint64_t tag_mask;
  std::string head, tail;   // the book's name: head + tag + tail
  PyObject* program;        // strong: a Program
  std::vector<PyObject*> conns;  // strong: each program pair's connection
  bool turnarounds;
  PyObject* token;          // strong: what Python adopts the book by
  PyObject* timeline;       // strong, or null (untimed): a native timeline; each start takes at(t + entry_delay)
  double entry_delay;       // the what-if's later entry for the collective
  bool drawn;               // `timeline` draws each start's entry: at(t + entry_delay, tag) makes a native one
  // -1: its first frames alone start it. Else a shape the wire leaves open (a ring whose size
  // only the call's note tells): it starts only an instance whose tag was armed with this id
  // (Core.arm), as the note of a call of that shape arrives before the call's first frame.
  int64_t arm;
  // Its first frame is a send notice whose length is the emulated peer's first receive on
  // the pair (an allgather's chunk 0): while the notices that settle the shape come, that
  // receive is posted ahead (Pair::post_ahead), so the real rank's data need not wait for them.
  bool post_ahead;
  // -1: none. Else the shape a call's note may tell (a ring's geometry): a note of it starts
  // the instance as it comes, before any of its frames (Core.note).
  int64_t note;
  bool guesses = false;  // its next instance's receives may be posted on a guess (Guesses, below)...
  size_t plan = 0;       // ...as the core's plans[plan] says
};

// What the core guesses of a starter's next instance (Guesses, below).
struct AheadPlan {
  int64_t last_tag = -1;  // its latest instance's tag
  uint64_t step = 0;      // the tags between its last two instances
  int streak = 0;         // instances in a row `step` apart
  int need = 0;           // the streak a guess waits for (0: kGuessStreak), doubled by a wrong guess
  int64_t guessed = -1;   // the tag its receives were posted for (-1: none)
  std::vector<std::pair<size_t, uint64_t>> recvs;  // (program pair, length): the receives an instance posts first
  uint64_t slot = 0;      // its latest instance's slot, whose tag bits are:
  int tag_shift = 0;
  uint64_t tag_mask = 0;
};

// A real rank's note link: its observer writes a line per noted call (note_line.h), which
// the loop reads natively (watch_notes).
struct NoteLink {
  int rank;
  std::string buf;  // a line not complete yet
};

// What Python told the core of a shape a call may note (know_note): its starters' ids.
struct NoteKnown {
  int64_t note;  // starters added with note=id (-1: none)
  int64_t arm;   // starters added with arm=id (-1: none)
};

// A note the loop read, kept for Python's bookkeeping (take_notes).
struct NoteRead {
  int rank;
  NoteLine line;
  bool known;  // its shape was known: the core did what Python would (started or armed it)
};

// A slot's first frames on a pair, held while they are a prefix of a starter's frames.
struct Pending {
  PairObject* pair;  // strong
  uint64_t slot;
  std::vector<gloo::Event> events;
  // Payloads a receive posted ahead (Starter::post_ahead) let come before the notices that
  // settle the shape: they go on after those notices (a pair's data meets its send notices
  // in order, whatever comes between).
  std::vector<gloo::Event> data;
  bool ahead = false;  // a receive of this slot was posted ahead
  bool guess = false;  // ...for an instance not begun, on a guess (Guesses, below), whose tag is:
  uint64_t tag = 0;
};

struct CoreObject {
  PyObject_HEAD
  std::vector<Timer>* heap;  // a min-heap (std::greater)
  std::vector<Starter>* starters;  // native starts (add_starter)
  std::vector<std::pair<PyObject*, PyObject*>>* started;  // (token, book), strong: started natively, not yet adopted
  std::vector<Pending>* pending;  // first frames held for a starter of several
  std::deque<std::pair<int64_t, uint64_t>>* arms;  // (arm id, tag): instances a note armed (arm()), oldest first
  int ep;  // the loop's epoll (-1 until the first watch)
  std::unordered_map<int, Watched>* watched;  // fd -> its pair
  uint64_t seq;
  PyObject* done;     // done(owner): every boundary message of the owner's instance crossed
  PyObject* emit;     // emit(conn): frames queued on a pair with no socket
  PyObject* call_at;  // call_at(when, book, pair) or None: timers run natively (wait)
  int pyfd;  // Python's own epoll, in ours (also())
  double busy_at;  // monotonic: the loop's last pair event or release (wait's busy window)
  double polled_s;  // the loop's time in its busy window's polls that found nothing (polled())
  int python_first;  // answers in a row whose pair events were left for after Python's turn
  CoreSink* sink;  // the virtual-time driver, when it runs the core (else null)
  std::unordered_map<int, NoteLink>* note_links;  // fd -> a real rank's note link (watch_notes)
  std::unordered_map<std::string, NoteKnown>* notes_known;  // a told shape (NoteLine::shape_key) -> its ids
  std::vector<NoteRead>* notes_read;  // read, not taken by Python yet (take_notes)
  // "group\treal rank" -> the latest collective tag in that rank's frames on the group's
  // pairs, shared with each pair (PairObject::last_tag): a note start's check.
  std::unordered_map<std::string, std::shared_ptr<int64_t>>* scopes;
  bool note_starts;  // a known noted shape starts on its note (note_starts)
  // Books not finished (complete or closed): a collective in flight. Python's idle work
  // waits for none to be (wait): a gap inside one collective is the real rank's own work
  // between two of its messages, and a Python turn there makes its next message wait.
  long in_flight;
  std::vector<AheadPlan>* plans;  // by Starter::plan
  uint64_t plans_gen;  // one more each time the plans are dropped
  bool guess_ahead;  // a repeating shape's next receives are posted as an instance starts (guess_ahead)
};

struct BookObject {
  PyObject_HEAD
  Book* book;
  CoreObject* core;                 // strong
  PyObject* owner;                  // strong until done
  std::vector<PyObject*>* conns;    // strong, by pair index
  std::vector<PairObject*>* pairs;  // strong (each conn's pair), by pair index
  bool routed;
  bool finished;
  bool posted_ahead;  // started natively after a receive was posted ahead of it (Starter::post_ahead)
  bool on_note;  // started natively as its call's note came, before any of its frames (Core.note)
  bool planned;   // started natively by a starter that guesses: its plan is the core's plans[plan]
  size_t plan;
  uint64_t plans_gen;  // the core's plans_gen then (the plans are dropped with the starters)
  uint64_t tag;
};

// Its core's in_flight counts every book with a core that is not `finished` (complete or
// closed): one more as the core is set, one less as `finished` turns true, or as it is
// freed unfinished.
void book_finish(BookObject* b) {
  if (b->finished) return;
  b->finished = true;
  if (b->core != nullptr) --b->core->in_flight;
}

// A recorded boundary program (book.h's Program), shared by the instances of one shape.
struct ProgramObject {
  PyObject_HEAD
  std::shared_ptr<Program>* program;  // shared with the books it is loaded into
  bool sealed;  // loaded into a book, which reads its ops in place: it grows no more
};

PyTypeObject CoreType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject BookType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- Core ------------------------------------------------------------------------------
int core_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"done", "emit", "call_at", nullptr};
  PyObject *done, *emit, *call_at = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O", const_cast<char**>(kw), &done, &emit, &call_at)) {
    return -1;
  }
  auto* self = reinterpret_cast<CoreObject*>(obj);
  if (self->heap == nullptr) {
    self->heap = new (std::nothrow) std::vector<Timer>();
    self->watched = new (std::nothrow) std::unordered_map<int, Watched>();
    self->starters = new (std::nothrow) std::vector<Starter>();
    self->started = new (std::nothrow) std::vector<std::pair<PyObject*, PyObject*>>();
    self->pending = new (std::nothrow) std::vector<Pending>();
    self->arms = new (std::nothrow) std::deque<std::pair<int64_t, uint64_t>>();
    self->note_links = new (std::nothrow) std::unordered_map<int, NoteLink>();
    self->notes_known = new (std::nothrow) std::unordered_map<std::string, NoteKnown>();
    self->notes_read = new (std::nothrow) std::vector<NoteRead>();
    self->scopes = new (std::nothrow) std::unordered_map<std::string, std::shared_ptr<int64_t>>();
    self->plans = new (std::nothrow) std::vector<AheadPlan>();
    self->ep = -1;
    self->pyfd = -1;
  }
  if (self->heap == nullptr || self->watched == nullptr || self->starters == nullptr || self->started == nullptr ||
      self->pending == nullptr || self->arms == nullptr || self->note_links == nullptr ||
      self->notes_known == nullptr || self->notes_read == nullptr || self->scopes == nullptr ||
      self->plans == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  for (PyObject** slot : {&self->done, &self->emit, &self->call_at}) Py_CLEAR(*slot);
  Py_INCREF(done);
  Py_INCREF(emit);
  Py_INCREF(call_at);
  self->done = done;
  self->emit = emit;
  self->call_at = call_at;
  return 0;
}

// The core holds Python callables (its hooks, which reach the engine and driver that
// hold it) and books: the collector must see them, or a finished run is never freed.
int core_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  Py_VISIT(self->done);
  Py_VISIT(self->emit);
  Py_VISIT(self->call_at);
  if (self->heap != nullptr) {
    for (const Timer& t : *self->heap) Py_VISIT(t.book);
  }
  if (self->watched != nullptr) {
    for (const auto& [fd, w] : *self->watched) {
      Py_VISIT(w.conn);
      Py_VISIT(reinterpret_cast<PyObject*>(w.pair));
    }
  }
  if (self->starters != nullptr) {
    for (const Starter& st : *self->starters) {
      Py_VISIT(reinterpret_cast<PyObject*>(st.pair));
      Py_VISIT(st.program);
      Py_VISIT(st.token);
      for (PyObject* c : st.conns) Py_VISIT(c);
      Py_VISIT(st.timeline);
    }
  }
  if (self->started != nullptr) {
    for (const auto& [token, book] : *self->started) {
      Py_VISIT(token);
      Py_VISIT(book);
    }
  }
  if (self->pending != nullptr) {
    for (const Pending& p : *self->pending) Py_VISIT(reinterpret_cast<PyObject*>(p.pair));
  }
  return 0;
}

bool has_pending(CoreObject* self, PairObject* po) {
  return self->pending != nullptr &&
         std::any_of(self->pending->begin(), self->pending->end(), [&](const Pending& p) { return p.pair == po; });
}

void drop_pending(CoreObject* self) {
  if (self->pending == nullptr) return;
  auto gone = std::move(*self->pending);
  self->pending->clear();
  for (Pending& p : gone) {
    if (p.pair->starts == reinterpret_cast<PyObject*>(self)) p.pair->starts = nullptr;
    Py_DECREF(reinterpret_cast<PyObject*>(p.pair));
  }
}

// Forgets every native start (their pairs no longer ask this core), and the arms for them.
void drop_starters(CoreObject* self) {
  if (self->arms != nullptr) self->arms->clear();
  if (self->notes_known != nullptr) self->notes_known->clear();  // their ids name starters no more
  if (self->plans != nullptr) self->plans->clear();
  ++self->plans_gen;
  if (self->starters == nullptr) return;
  std::vector<Starter> gone = std::move(*self->starters);
  self->starters->clear();
  for (Starter& st : gone) {  // a pair with frames held still asks, to hand them back
    if (st.pair->starts == reinterpret_cast<PyObject*>(self) && !has_pending(self, st.pair)) st.pair->starts = nullptr;
  }
  for (Starter& st : gone) {
    Py_DECREF(reinterpret_cast<PyObject*>(st.pair));
    Py_DECREF(st.program);
    Py_DECREF(st.token);
    Py_XDECREF(st.timeline);
    for (PyObject* c : st.conns) Py_DECREF(c);
  }
}

void drop_started(CoreObject* self) {
  if (self->started == nullptr) return;
  auto gone = std::move(*self->started);
  self->started->clear();
  for (auto& [token, book] : gone) {
    Py_DECREF(token);
    Py_DECREF(book);
  }
}

int core_clear(PyObject* obj) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  for (PyObject** slot : {&self->done, &self->emit, &self->call_at}) Py_CLEAR(*slot);
  drop_starters(self);
  drop_started(self);
  drop_pending(self);
  if (self->heap != nullptr) {  // a book holds its core: its pending timers close that cycle
    std::vector<Timer> timers = std::move(*self->heap);
    self->heap->clear();
    for (Timer& t : timers) Py_DECREF(t.book);
  }
  return 0;
}

void core_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  auto* self = reinterpret_cast<CoreObject*>(obj);
  if (self->heap != nullptr) {
    for (Timer& t : *self->heap) Py_DECREF(t.book);
    delete self->heap;
  }
  if (self->watched != nullptr) {
    for (auto& [fd, w] : *self->watched) {
      Py_DECREF(w.conn);
      Py_DECREF(reinterpret_cast<PyObject*>(w.pair));
    }
    delete self->watched;
  }
  drop_starters(self);
  drop_started(self);
  drop_pending(self);
  delete self->starters;
  delete self->started;
  delete self->pending;
  delete self->arms;
  delete self->note_links;  // Python owns the sockets
  delete self->notes_known;
  delete self->notes_read;
  delete self->scopes;
  delete self->plans;
  if (self->ep >= 0) ::close(self->ep);
  for (PyObject** slot : {&self->done, &self->emit, &self->call_at}) Py_CLEAR(*slot);
  Py_TYPE(obj)->tp_free(obj);
}

// The loop writes the rest when the socket can take it; false if the core does not watch `fd`.
bool want_write(CoreObject* core, int fd) {
  auto it = core->watched->find(fd);
  if (it == core->watched->end()) return false;
  if (!it->second.writing) {
    struct epoll_event ev {};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.fd = fd;
    ::epoll_ctl(core->ep, EPOLL_CTL_MOD, fd, &ev);
    it->second.writing = true;
  }
  return true;
}

bool call1(PyObject* fn, PyObject* arg) {
  if (fn == nullptr) {  // cleared: the core is garbage, and nothing it hooked is left to call
    PyErr_SetString(PyExc_RuntimeError, "the core's hooks are gone");
    return false;
  }
  PyObject* r = PyObject_CallOneArg(fn, arg);
  Py_XDECREF(r);
  return r != nullptr;
}

// Carries out what a book call asked for: timers, writes, completion. False: a Python error is set.
void post_guesses(CoreObject* core, BookObject* b, const std::vector<size_t>& dirty);  // Guesses (below)

bool apply(BookObject* b, Actions& a) {
  CoreObject* core = b->core;
  for (const auto& [when, pair] : a.timers) {
    if (core->sink != nullptr) {
      core->sink->timer(when, reinterpret_cast<PyObject*>(b), pair);
    } else if (core->call_at != nullptr && core->call_at != Py_None) {
      PyObject* r = PyObject_CallFunction(core->call_at, "dOn", when, reinterpret_cast<PyObject*>(b),
                                          static_cast<Py_ssize_t>(pair));
      if (r == nullptr) return false;
      Py_DECREF(r);
    } else {
      Py_INCREF(b);
      core->heap->push_back(Timer{when, core->seq++, reinterpret_cast<PyObject*>(b), pair});
      std::push_heap(core->heap->begin(), core->heap->end(), std::greater<Timer>());
    }
  }
  std::vector<size_t>& dirty = a.dirty;
  if (dirty.size() > 1) {
    std::sort(dirty.begin(), dirty.end());
    dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
  }
  if (b->planned && !b->finished && !dirty.empty()) post_guesses(core, b, dirty);
  for (size_t i : dirty) {
    PairObject* po = (*b->pairs)[i];
    PyObject* conn = (*b->conns)[i];
    if (po == nullptr) {
      PyErr_Format(PyExc_RuntimeError, "the book wrote to pair %zu before its connection opened", i);
      return false;
    }
    if (po->fd < 0) {
      if (!(core->sink != nullptr ? core->sink->emit(conn, po) : call1(core->emit, conn))) return false;
      continue;
    }
    int err = 0;
    if (po->pair->outbox().flush(po->fd, &err) != FlushResult::kDone) {
      want_write(core, po->fd);  // the loop writes the rest when it can (or sees the socket gone)
    }
  }
  if (a.complete && !b->finished) {
    book_finish(b);
    b->book->drop_payloads();  // every send is out: the bytes go now, not when Python adopts or closes it
    PyObject* owner = b->owner;
    b->owner = nullptr;
    if (owner == Py_None) {  // started natively, not adopted yet: Python finds it done (take_started)
      Py_DECREF(owner);
      return true;
    }
    const bool ok = call1(core->done, owner);
    Py_DECREF(owner);
    return ok;
  }
  return true;
}

// Actions for book calls, reused: a call that runs inside another's hooks takes the next.
// Their vectors keep their capacity, so a frame costs no allocation for what it asks.
class ActionsLease {
 public:
  ActionsLease() {
    if (depth_ == pool_.size()) pool_.push_back(std::make_unique<Actions>());
    a_ = pool_[depth_++].get();
    a_->timers.clear();
    a_->dirty.clear();
    a_->complete = false;
  }
  ~ActionsLease() { --depth_; }
  ActionsLease(const ActionsLease&) = delete;
  ActionsLease& operator=(const ActionsLease&) = delete;
  Actions& get() { return *a_; }

 private:
  static inline std::vector<std::unique_ptr<Actions>> pool_;  // the GIL keeps it to one thread
  static inline size_t depth_ = 0;
  Actions* a_;
};

// Runs a book call and applies its actions, turning the book's faults into Python errors.
template <typename F>
bool run_book(BookObject* b, F&& body) {
  ActionsLease lease;
  Actions& a = lease.get();
  try {
    body(a);
  } catch (const ProtocolFault& e) {
    PyErr_SetString(g_protocol_error, e.what());
    return false;
  } catch (const PyErrorSet&) {
    return false;
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return false;
  } catch (const std::out_of_range&) {
    PyErr_SetString(PyExc_IndexError, "no such pair in the book");
    return false;
  }
  return apply(b, a);
}

// Runs `body` on a live book (holding it: its hooks may drop the last other reference).
template <typename F>
PyObject* book_call(BookObject* self, F&& body) {
  if (self->finished) Py_RETURN_NONE;
  Py_INCREF(self);
  const bool ok = run_book(self, body);
  Py_DECREF(self);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// Runs the native timers due by `now`; -1 with a Python error set.
long run_timers(CoreObject* self, double now) {
  long ran = 0;
  while (self->heap != nullptr && !self->heap->empty() && self->heap->front().at <= now) {
    std::pop_heap(self->heap->begin(), self->heap->end(), std::greater<Timer>());
    Timer t = self->heap->back();
    self->heap->pop_back();
    auto* b = reinterpret_cast<BookObject*>(t.book);
    const bool ok = b->finished || run_book(b, [&](Actions& a) { b->book->due(t.pair, now, a); });
    Py_DECREF(t.book);
    if (!ok) return -1;
    ++ran;
  }
  return ran;
}

double monotonic() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // Python's time.monotonic()
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

bool ensure_epoll(CoreObject* self) {
  if (self->ep >= 0) return true;
  self->ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (self->ep < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return false;
  }
  return true;
}

bool ctl(CoreObject* self, int op, int fd, uint32_t events) {
  struct epoll_event ev {};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(self->ep, op, fd, &ev) != 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return false;
  }
  return true;
}

// The pair of `conn` (a real rank's, in a group) shares its (global) rank's latest collective tag
// in that group with the rank's other pairs there; a new connection starts it afresh (a
// group's pairs open before its first collective, a new generation's anew). A conn that
// names no group and rank (a test's) has none, and no note may start its instances.
bool join_scope(CoreObject* self, PyObject* conn, PairObject* po) {
  PyObject* group = PyObject_GetAttrString(conn, "group");
  PyObject* name = group != nullptr ? PyObject_GetAttrString(group, "name") : nullptr;
  PyObject* in_group = PyObject_GetAttrString(conn, "real");  // the group's rank; a note names the global one
  PyObject* real = group != nullptr && in_group != nullptr ? PyObject_CallMethod(group, "global_rank", "O", in_group)
                                                            : nullptr;
  Py_XDECREF(group);
  Py_XDECREF(in_group);
  if (name == nullptr || real == nullptr || !PyUnicode_Check(name) || !PyLong_Check(real)) {
    Py_XDECREF(name);
    Py_XDECREF(real);
    PyErr_Clear();
    return true;
  }
  const char* text = PyUnicode_AsUTF8(name);
  const long rank = PyLong_AsLong(real);
  Py_DECREF(name);
  Py_DECREF(real);
  if (text == nullptr || (rank == -1 && PyErr_Occurred())) return false;
  auto& cell = (*self->scopes)[std::string(text) + '\t' + std::to_string(rank)];
  if (!cell) cell = std::make_shared<int64_t>(-1);
  *cell = -1;
  if (po->last_tag == nullptr) po->last_tag = new (std::nothrow) std::shared_ptr<int64_t>();
  if (po->last_tag == nullptr) {
    PyErr_NoMemory();
    return false;
  }
  *po->last_tag = cell;
  return true;
}

PyObject* core_watch(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  int fd;
  PyObject* conn;
  const char* label;
  if (!PyArg_ParseTuple(args, "iOs", &fd, &conn, &label) || !ensure_epoll(self)) return nullptr;
  PyObject* pair = PyObject_GetAttrString(conn, "pair");
  if (pair == nullptr) return nullptr;
  if (!PyObject_TypeCheck(pair, &PairType)) {
    Py_DECREF(pair);
    PyErr_SetString(PyExc_TypeError, "a watched connection must carry a native pair (conn.pair)");
    return nullptr;
  }
  if (self->watched->count(fd) != 0 || !ctl(self, EPOLL_CTL_ADD, fd, EPOLLIN)) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "fd %d is watched already", fd);
    Py_DECREF(pair);
    return nullptr;
  }
  Py_INCREF(conn);
  (*self->watched)[fd] = Watched{conn, reinterpret_cast<PairObject*>(pair), label, false};
  if (!join_scope(self, conn, reinterpret_cast<PairObject*>(pair))) return nullptr;
  Py_RETURN_NONE;
}

PyObject* core_unwatch(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  const int fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred()) return nullptr;
  auto it = self->watched->find(fd);
  if (it == self->watched->end()) Py_RETURN_FALSE;
  ::epoll_ctl(self->ep, EPOLL_CTL_DEL, fd, nullptr);  // a closed fd has left the set already
  Watched w = it->second;
  self->watched->erase(it);
  Py_DECREF(w.conn);
  Py_DECREF(reinterpret_cast<PyObject*>(w.pair));
  Py_RETURN_TRUE;
}

PyObject* core_write_wanted(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  const int fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(want_write(self, fd));
}

PyObject* core_also(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  const int fd = PyLong_AsLong(arg);
  if ((fd == -1 && PyErr_Occurred()) || !ensure_epoll(self)) return nullptr;
  if (!ctl(self, EPOLL_CTL_ADD, fd, EPOLLIN)) return nullptr;
  self->pyfd = fd;
  Py_RETURN_NONE;
}

constexpr int kPythonFirst = 8;  // answers in a row that may serve Python before the pairs (wait)
constexpr double kSpinS = 0.0015;  // epoll sleeps in whole ms: sleep to this close to a timer, then poll
constexpr int kMaxEvents = 64;
constexpr size_t kStartedMax = 64;  // books started natively that may wait for a busy loop to adopt them
constexpr double kQuietInFlightS = 0.001;  // a collective in flight puts idle work off until this quiet
constexpr double kTurnRoomS = 0.001;  // ...and a native timer due sooner than this (a release) keeps it off
constexpr size_t kArmsKept = 256;   // notes' arms for instances not started yet (arm)
constexpr size_t kNotesKnownMax = 1024;  // noted shapes the core acts on itself (know_note); more: told anew

// One pair socket's readiness, served natively; what Python must see goes into `out`.
// `ready_at`: when epoll reported it (see core_wait).
bool serve(CoreObject* self, int fd, uint32_t events, double ready_at, PyObject* out) {
  auto it = self->watched->find(fd);
  if (it == self->watched->end()) return true;
  Watched w = it->second;  // the hooks below may unwatch it: hold what this call uses
  Py_INCREF(w.conn);
  Py_INCREF(reinterpret_cast<PyObject*>(w.pair));
  bool ok = true;
  PyObject* got = nullptr;
  if (events & EPOLLOUT) {
    int err = 0;
    switch (w.pair->pair->outbox().flush(fd, &err)) {
      case FlushResult::kDone:
        if (self->watched->count(fd) != 0) {
          (*self->watched)[fd].writing = false;
          struct epoll_event ev {};
          ev.events = EPOLLIN;
          ev.data.fd = fd;
          ::epoll_ctl(self->ep, EPOLL_CTL_MOD, fd, &ev);
        }
        break;
      case FlushResult::kPartial:
        break;
      default:
        got = Py_None;  // gone
        Py_INCREF(got);
    }
  }
  if (got == nullptr && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
    got = read_pair(w.pair, fd, ready_at);
    if (got == nullptr) {
      ok = false;
      if (PyErr_ExceptionMatches(g_wire_error)) {  // name the pair, as the wire cannot
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr;
        PyErr_Format(g_wire_error, "%s: %U", w.label.c_str(), text != nullptr ? text : Py_None);
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
      }
    }
  }
  if (ok && got != nullptr && (got == Py_None || PyList_GET_SIZE(got) > 0)) {
    PyObject* item = PyTuple_Pack(2, w.conn, got);
    ok = item != nullptr && PyList_Append(out, item) == 0;
    Py_XDECREF(item);
  }
  Py_XDECREF(got);
  Py_DECREF(w.conn);
  Py_DECREF(reinterpret_cast<PyObject*>(w.pair));
  return ok;
}

// wait(until, idle=False, busy=0, spin=0, hold=True) -> ([(conn, events | None)], python): serve the
// pair sockets and the native timers until Python has something to do: events no book took
// (None: the socket closed), its own epoll readable, or `until` (monotonic) reached; and,
// when Python has idle work (`idle`, or books started natively to adopt), once nothing is
// ready. `busy` (s): for this long after the last pair event or release, the loop polls
// rather than sleeps and puts Python's idle work off. A sleeping loop wakes up late, and
// Python's turn, once begun, makes a frame that comes meanwhile wait: in the short gaps
// between one collective's frames either would be the emulator's lag. `spin` (s, from the
// same event): the loop goes on polling, with Python's idle work no longer put off, so the
// first frame of the next collective, after the real rank's compute, finds it awake (a
// sleeping loop's wake-up cost 40 us there). Only for a loop with a core of its own (the
// launcher's placement).
//
// While a collective is in flight (a book not finished), idle work waits longer: a
// quiet gap inside one collective is the real rank reducing what it received (up to
// 0.4 ms at 4 MiB), or the wait for a release the model puts shortly after, and a Python
// turn begun there (0.1-0.4 ms: an adoption, a record) would hold the real rank's next
// message or the release. It runs in the gaps between collectives (the real rank's
// compute), or as the last one completes once kStartedMax started books wait (a stream
// of collectives with no gap); mid-collective only with no native timer due within
// kTurnRoomS, after the busy window where one is due later (the real rank waits for a
// release far off: a what-if) and after kQuietInFlightS where none is (a rank stalled),
// and at once when twice kStartedMax wait. `hold=False` leaves the books in flight out
// (the busy window alone, kStartedMax adopted at once: a reference).
int wait_events(CoreObject* self, struct epoll_event* evs, double timeout_s) {
  int n;
  Py_BEGIN_ALLOW_THREADS
  n = ::epoll_wait(self->ep, evs, kMaxEvents,
                   timeout_s > kSpinS ? static_cast<int>(std::ceil(std::min(timeout_s - kSpinS, 0.5) * 1e3)) : 0);
  Py_END_ALLOW_THREADS
  return n;
}

// Sleeps in epoll for at least `timeout_s`, in whole ms, never polling: a sleeping loop
// waits so for idle work held off while a collective is in flight (wait), which may come
// a little late, where a poll to the moment would spend a core a real rank may share.
int nap_events(CoreObject* self, struct epoll_event* evs, double timeout_s) {
  int n;
  Py_BEGIN_ALLOW_THREADS
  n = ::epoll_wait(self->ep, evs, kMaxEvents, static_cast<int>(std::ceil(std::min(timeout_s, 0.5) * 1e3)));
  Py_END_ALLOW_THREADS
  return n;
}

// Polls the pair sockets without the GIL until one is ready or `end` (monotonic) comes: a
// loop that held it through its polls would keep the controller's other threads (a group's
// setup, the control service, the NCCL relay) from it for up to the interpreter's 5 ms
// switch interval each time. `last_empty`: when the last poll that found nothing returned.
int spin_events(CoreObject* self, struct epoll_event* evs, double end, double* last_empty) {
  int n;
  Py_BEGIN_ALLOW_THREADS
  for (;;) {
    n = ::epoll_wait(self->ep, evs, kMaxEvents, 0);
    if (n != 0) break;
    *last_empty = monotonic();
    if (*last_empty >= end) break;
  }
  Py_END_ALLOW_THREADS
  return n;
}

int serve_notes(CoreObject* self, int fd, double now, bool read);  // the note links (below)

PyObject* core_wait(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  double until, busy = 0.0, spin = 0.0;
  int idle = 0, hold = 1;
  if (!PyArg_ParseTuple(args, "d|pddp", &until, &idle, &busy, &spin, &hold) || !ensure_epoll(self)) return nullptr;
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  bool python = false;
  struct epoll_event evs[kMaxEvents];
  for (;;) {
    const double now = monotonic();
    const long ran = run_timers(self, now);
    if (ran < 0) {
      Py_DECREF(out);
      return nullptr;
    }
    if (ran > 0) self->busy_at = now;
    if (python || PyList_GET_SIZE(out) > 0 || now >= until) break;
    const bool polling = now < self->busy_at + busy;
    const bool spinning = polling || now < self->busy_at + spin;
    // Python's idle work: its own, books started natively to adopt, notes read to note down.
    const bool idle_work = idle != 0 || !self->started->empty() || !self->notes_read->empty();
    double next = until;
    if (!self->heap->empty()) next = std::min(next, self->heap->front().at);
    const size_t backlog = std::max(self->started->size(), self->notes_read->size());
    bool idle_due = false;
    double idle_at = std::numeric_limits<double>::infinity();  // when held idle work comes due
    if (idle_work) {
      if (hold == 0 || self->in_flight == 0) {  // (hold == 0: the reference, the busy window alone)
        idle_due = !polling || backlog >= kStartedMax;
      } else if (backlog >= 2 * kStartedMax) {  // a stream with no gap: bounded all the same
        idle_due = true;
      } else {
        // A release the model puts far off (a what-if): the real rank waits for it, and the
        // idle turn fits in that wait as in a gap between collectives.
        const bool room = self->heap->empty() || self->heap->front().at >= now + kTurnRoomS;
        const bool waits = room && !self->heap->empty();
        const double quiet_until = self->busy_at + (waits ? busy : std::max(busy, kQuietInFlightS));
        idle_due = now >= quiet_until && room;
        if (!idle_due && room) idle_at = quiet_until;
      }
    }
    int n;
    if (spinning && !idle_due) {  // until a socket is ready, a timer is due, or the phase ends
      const double phase = polling && idle_work ? busy : std::max(busy, spin);  // the window's end lets it run
      const double from = monotonic();  // after this pass's timers, which are work
      double last_empty = from;
      n = spin_events(self, evs, std::min({next, idle_at, self->busy_at + phase}), &last_empty);
      self->polled_s += last_empty - from;  // polls that found nothing are no work of the loop's
    } else if (!idle_due && idle_at < next) {
      n = nap_events(self, evs, idle_at - now);  // idle work may come a little late; a release may not
    } else {
      n = wait_events(self, evs, idle_due ? 0.0 : next - now);
    }
    if (n < 0) {
      if (errno == EINTR) {
        if (PyErr_CheckSignals() != 0) {
          Py_DECREF(out);
          return nullptr;
        }
        continue;
      }
      Py_DECREF(out);
      return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n == 0 && PyErr_CheckSignals() != 0) {  // a polling loop sees no EINTR
      Py_DECREF(out);
      return nullptr;
    }
    // Every frame of one epoll answer is stamped with its time: they were all in by then.
    // Stamped as each is served, a frame would carry the time spent on the ones before
    // it (a book started natively, a release), and a rank's last frame of one collective
    // could read as later than its first of the next, an overlap it never had.
    const double ready_at = n > 0 ? monotonic() : 0.0;
    // The note links before all: a call's note precedes its frames (the rank wrote it
    // first). A known shape starts or is armed here; an unknown one is Python's to arm
    // before any frame a starter might take, as its own epoll's events are (below).
    int notes = 0;
    for (int i = 0; i < n; ++i) {
      if (self->note_links->count(evs[i].data.fd) == 0) continue;
      ++notes;
      self->busy_at = monotonic();
      const int urgent = serve_notes(self, evs[i].data.fd, ready_at, true);
      if (urgent < 0) {
        Py_DECREF(out);
        return nullptr;
      }
      python = python || urgent != 0 || self->notes_read->size() >= kStartedMax;  // Python takes them in turn
    }
    if (python && n > notes && self->python_first < kPythonFirst) {
      ++self->python_first;
      continue;
    }
    // Python's events first when its epoll is in an answer with pair events: an observer's
    // note of a call's size precedes that call's frames (the rank wrote it first), and a
    // frame a starter would take must not start a book the note rules out
    // (controller/observer_link.py). The pairs stay readable and are served at a later
    // call; at most kPythonFirst answers in a row, so a busy Python cannot starve them.
    if (n > 1 && self->python_first < kPythonFirst) {
      for (int i = 0; i < n && !python; ++i) python = evs[i].data.fd == self->pyfd;
      if (python) {
        ++self->python_first;
        continue;
      }
    }
    self->python_first = 0;
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == self->pyfd) {
        python = true;
        continue;
      }
      if (self->note_links->count(evs[i].data.fd) != 0) continue;  // served above
      self->busy_at = monotonic();
      if (!serve(self, evs[i].data.fd, evs[i].events, ready_at, out)) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    if (idle_due && n == 0) break;  // nothing ready: Python has work put off for an idle loop
  }
  PyObject* result = Py_BuildValue("(OO)", out, python ? Py_True : Py_False);
  Py_DECREF(out);
  return result;
}

Program* program_of(PyObject* obj);

// add_starter(conn, index, mask, value, frames, tag_shift, tag_mask, head, tail, program, conns, turnarounds,
//             token, timeline, entry_delay, drawn=False, arm=-1, post_ahead=False, note=-1)
PyObject* core_add_starter(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  PyObject *conn, *frames_list, *program, *conns, *token, *timeline;
  Py_ssize_t index;
  unsigned long long mask, value, tag_mask;
  int tag_shift, turnarounds;
  const char *head, *tail;
  double entry_delay;
  int drawn = 0;
  long long arm = -1;
  int post_ahead = 0;
  long long note = -1;
  int guesses = 0;
  if (!PyArg_ParseTuple(args, "OnKKO!iKssO!O!pOOd|pLpLp", &conn, &index, &mask, &value, &PyList_Type, &frames_list,
                        &tag_shift, &tag_mask, &head, &tail, &ProgramType, &program, &PyList_Type, &conns, &turnarounds,
                        &token, &timeline, &entry_delay, &drawn, &arm, &post_ahead, &note, &guesses)) {
    return nullptr;
  }
  std::vector<std::pair<gloo::EventKind, uint64_t>> frames;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(frames_list); ++i) {
    int send_ready;
    unsigned long long length;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(frames_list, i), "pK", &send_ready, &length)) return nullptr;
    frames.emplace_back(send_ready != 0 ? gloo::EventKind::kSendReady : gloo::EventKind::kRecvReady, length);
  }
  if (post_ahead != 0 && (frames.size() < 2 || frames.front().first != gloo::EventKind::kSendReady)) {
    PyErr_SetString(PyExc_ValueError, "a starter posts ahead only from a first send notice, before the frames after it");
    return nullptr;
  }
  if (drawn != 0 && timeline == Py_None) {
    PyErr_SetString(PyExc_ValueError, "a drawn starter needs the timeline that draws each start's entry");
    return nullptr;
  }
  if (timeline != Py_None && drawn == 0) {
    const timing::TimingApi* api = timing_api();
    int kind = 0;
    if (api == nullptr || api->native_of(timeline, &kind) == nullptr) {
      PyErr_SetString(PyExc_TypeError, "a starter's timeline must be a native one (neuronabox.schedules._timing)");
      return nullptr;
    }
  }
  if (self->starters == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Core.__init__ was not called");
    return nullptr;
  }
  const Program* p = program_of(program);
  if (p == nullptr) return nullptr;
  if (static_cast<size_t>(PyList_GET_SIZE(conns)) != p->pairs.size() || index < 0 ||
      static_cast<size_t>(index) >= p->pairs.size()) {
    PyErr_SetString(PyExc_ValueError, "a starter names one connection per program pair, and its first frame's pair");
    return nullptr;
  }
  if (frames.empty() || (frames.size() > 1 && p->pairs.size() != 1)) {
    PyErr_SetString(PyExc_ValueError, "a starter has a first frame, and several only for a program of one pair");
    return nullptr;
  }
  PyObject* pair = PyObject_GetAttrString(conn, "pair");
  if (pair == nullptr) return nullptr;
  auto* po = reinterpret_cast<PairObject*>(pair);
  if (!PyObject_TypeCheck(pair, &PairType) || (po->starts != nullptr && po->starts != obj)) {
    Py_DECREF(pair);
    PyErr_SetString(PyExc_TypeError, "a starter's connection carries a native pair no other core starts on");
    return nullptr;
  }
  Starter st{po, static_cast<size_t>(index), mask, value, std::move(frames), tag_shift, tag_mask,
             head, tail, program, {}, turnarounds != 0, token, timeline != Py_None ? timeline : nullptr,
             entry_delay, drawn != 0, arm < 0 ? -1 : static_cast<int64_t>(arm), post_ahead != 0,
             note < 0 ? -1 : static_cast<int64_t>(note)};
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(conns); ++i) {
    PyObject* c = PyList_GET_ITEM(conns, i);
    Py_INCREF(c);
    st.conns.push_back(c);
  }
  Py_INCREF(program);
  Py_INCREF(token);
  Py_XINCREF(st.timeline);
  po->starts = obj;  // the reference GetAttr gave is the starter's
  st.guesses = guesses != 0;
  st.plan = self->plans->size();
  self->plans->emplace_back();
  self->starters->push_back(std::move(st));
  self->notes_known->clear();  // a noted shape may start or arm this one now: Python tells the core anew
  Py_RETURN_NONE;
}

// arm(id, tag): the instance of this tag may start from a starter added with `arm=id`
// (the note of its call told the shape that starter has). The oldest arms go first: a
// note whose instance started from Python, or another real rank's note of an instance
// already started, is never asked for again.
PyObject* core_arm(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  long long id;
  unsigned long long tag;
  if (!PyArg_ParseTuple(args, "LK", &id, &tag)) return nullptr;
  if (self->arms == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Core.__init__ was not called");
    return nullptr;
  }
  if (self->arms->size() >= kArmsKept) self->arms->pop_front();
  self->arms->emplace_back(static_cast<int64_t>(id), static_cast<uint64_t>(tag));
  Py_RETURN_NONE;
}

int start_on_note(CoreObject* core, int64_t note, uint64_t tag, double now, const std::string& group, int rank);

// Whether a note of `tag` from real rank `rank` in `group` names its call truly: its tag is
// the one after the latest collective tag in that rank's frames on the group's pairs. The
// observer tells the tag as the group's sequence number less the point-to-point operations
// it saw (neuronabox/observer/sizes.py); one it could not see (a C++ caller's) moves every
// later note's tag past its call's, and only the frames show it. A collective still in
// flight (its frames not in yet) also fails the check, and its instance starts at its first
// frame instead: a note never starts a ring on a tag the frames have not led up to.
bool names_its_call(const CoreObject* core, const std::string& group, int rank, uint64_t tag) {
  auto it = core->scopes->find(group + '\t' + std::to_string(rank));
  if (it == core->scopes->end() || *it->second < 0) return false;
  return ((tag - 1) & 0xFFFFFFFFu) == static_cast<uint64_t>(*it->second);
}

// note(id, tag, now, group, rank) -> bool: the note of real rank `rank`'s call in `group`
// told the instance of this tag a shape whose starters were added with `note=id`; one of
// them starts it now, if the tag names the call (start_on_note).
PyObject* core_note(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  long long id;
  unsigned long long tag;
  double now;
  const char* group;
  int rank;
  if (!PyArg_ParseTuple(args, "LKdsi", &id, &tag, &now, &group, &rank)) return nullptr;
  if (self->starters == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Core.__init__ was not called");
    return nullptr;
  }
  const int started = start_on_note(self, static_cast<int64_t>(id), static_cast<uint64_t>(tag), now, group, rank);
  if (started < 0) return nullptr;
  return PyBool_FromLong(started);
}

// -- note links ------------------------------------------------------------------------
// watch_notes(fd, rank, early=b""): the loop reads real rank `rank`'s note link (its
// observer's second connection, past its hello; `early`: what came after the hello).
PyObject* core_watch_notes(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  int fd, rank;
  const char* early = "";
  Py_ssize_t early_n = 0;
  if (!PyArg_ParseTuple(args, "ii|y#", &fd, &rank, &early, &early_n) || !ensure_epoll(self)) return nullptr;
  if (self->note_links->count(fd) != 0 || self->watched->count(fd) != 0) {
    PyErr_Format(PyExc_ValueError, "fd %d is watched already", fd);
    return nullptr;
  }
  if (!ctl(self, EPOLL_CTL_ADD, fd, EPOLLIN)) return nullptr;
  (*self->note_links)[fd] = NoteLink{rank, std::string(early, static_cast<size_t>(early_n))};
  if (serve_notes(self, fd, monotonic(), false) < 0) return nullptr;  // the early lines now: the socket may stay quiet
  Py_RETURN_NONE;
}

PyObject* core_unwatch_notes(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  const int fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred()) return nullptr;
  if (self->note_links->erase(fd) == 0) Py_RETURN_FALSE;
  ::epoll_ctl(self->ep, EPOLL_CTL_DEL, fd, nullptr);
  Py_RETURN_TRUE;
}

// know_note(group, kind, numel, dtype, note, arm): a note of this shape starts the starters
// added with note=`note` (Core.note's check first), else arms those added with arm=`arm`
// (-1: none), as the loop reads it, before Python hears of it. Forgotten with the starters.
PyObject* core_know_note(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  NoteLine shape;
  const char *group, *kind, *dtype;
  unsigned long long numel;
  long long note, arm;
  if (!PyArg_ParseTuple(args, "ssKsLL", &group, &kind, &numel, &dtype, &note, &arm)) return nullptr;
  shape.group = group;
  shape.kind = kind;
  shape.numel = numel;
  shape.dtype = dtype;
  if (self->notes_known->size() >= kNotesKnownMax) self->notes_known->clear();  // a script of ever new sizes
  (*self->notes_known)[shape.shape_key()] = NoteKnown{note, arm};
  Py_RETURN_NONE;
}

PyObject* core_set_note_starts(PyObject* obj, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  reinterpret_cast<CoreObject*>(obj)->note_starts = on != 0;
  Py_RETURN_NONE;
}

// take_notes() -> [(rank, group, tag, kind, numel, dtype, known)] (or ()): the notes the
// loop read since the last call, in order; `known`: the core did with it what Python would.
PyObject* core_take_notes(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  if (self->notes_read == nullptr || self->notes_read->empty()) return PyTuple_New(0);
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const NoteRead& r : *self->notes_read) {
    const NoteLine& n = r.line;
    PyObject* item = Py_BuildValue("(isKsKsO)", r.rank, n.group.c_str(), static_cast<unsigned long long>(n.tag),
                                   n.kind.c_str(), static_cast<unsigned long long>(n.numel), n.dtype.c_str(),
                                   r.known ? Py_True : Py_False);
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(item);
  }
  self->notes_read->clear();
  return out;
}

// One note as the loop reads it: a known shape starts now (its tag checked) or is armed.
// Returns 1 if Python must see it before any frame (an unknown shape: Python arms it),
// 0 if not, -1 with a Python error set.
int take_note(CoreObject* self, int rank, NoteLine&& line, double now) {
  auto known = self->notes_known->find(line.shape_key());
  const bool is_known = known != self->notes_known->end();
  if (is_known) {
    int started = 0;
    if (self->note_starts && known->second.note >= 0) {
      started = start_on_note(self, known->second.note, line.tag, now, line.group, rank);
      if (started < 0) return -1;
    }
    if (started == 0 && known->second.arm >= 0) {
      if (self->arms->size() >= kArmsKept) self->arms->pop_front();
      self->arms->emplace_back(known->second.arm, line.tag);
    }
  }
  self->notes_read->push_back(NoteRead{rank, std::move(line), is_known});
  return is_known ? 0 : 1;
}

// A note link's readiness: every complete line taken (take_note). 1: one of them needs
// Python first; 0: none; -1 with a Python error set (a line that is no note). A closed
// link leaves the loop (Python closes its socket, with the observer's).
int serve_notes(CoreObject* self, int fd, double now, bool read) {
  auto it = self->note_links->find(fd);
  if (it == self->note_links->end()) return 0;
  const int rank = it->second.rank;
  std::string& buf = it->second.buf;
  bool closed = false;
  char chunk[4096];
  for (int chunks = 0; read && chunks < 16; ++chunks) {  // at most 64 KiB a pass: the socket stays ready for more
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof chunk) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  int urgent = 0;
  size_t start = 0;
  for (size_t end; (end = buf.find('\n', start)) != std::string::npos; start = end + 1) {
    NoteLine line;
    const std::string_view text(buf.data() + start, end - start);
    if (!parse_note_line(text, &line)) {
      PyErr_Format(PyExc_ValueError, "the note link of real rank %d sent a line that is not a note: %.80s", rank,
                   std::string(text).c_str());
      return -1;
    }
    const int got = take_note(self, rank, std::move(line), now);
    if (got < 0) return -1;
    urgent |= got;
  }
  buf.erase(0, start);
  if (buf.size() > kNoteLineMax) {
    PyErr_Format(PyExc_ValueError, "the note link of real rank %d sent a line longer than %zu bytes", rank,
                 kNoteLineMax);
    return -1;
  }
  if (closed) {
    ::epoll_ctl(self->ep, EPOLL_CTL_DEL, fd, nullptr);
    self->note_links->erase(fd);
  }
  return urgent;
}

PyObject* core_set_guess_ahead(PyObject* obj, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  reinterpret_cast<CoreObject*>(obj)->guess_ahead = on != 0;
  Py_RETURN_NONE;
}

PyObject* core_polled(PyObject* obj, PyObject*) {
  return PyFloat_FromDouble(reinterpret_cast<CoreObject*>(obj)->polled_s);
}

PyObject* core_in_flight(PyObject* obj, PyObject*) {
  return PyLong_FromLong(reinterpret_cast<CoreObject*>(obj)->in_flight);
}

PyObject* core_clear_starters(PyObject* obj, PyObject*) {
  drop_starters(reinterpret_cast<CoreObject*>(obj));
  Py_RETURN_NONE;
}

PyObject* core_take_started(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<CoreObject*>(obj);
  const size_t n = self->started != nullptr ? self->started->size() : 0;
  if (n == 0) return PyTuple_New(0);  // every loop turn asks: the shared empty tuple, no allocation
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(n));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < n; ++i) {
    auto& [token, book] = (*self->started)[i];
    PyObject* item = PyTuple_Pack(2, token, book);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
  }
  drop_started(self);
  return out;
}

PyMethodDef core_methods[] = {
    {"add_starter", core_add_starter, METH_VARARGS,
     "add_starter(conn, index, mask, value, send_ready, length, tag_shift, tag_mask, head, tail, program, conns, "
     "turnarounds, token, timeline, entry_delay, drawn=False, arm=-1): a first notice of this kind and length on "
     "conn's pair, for a slot with slot & mask == value and no book (and, with arm >= 0, a tag armed with that id: "
     "arm()), starts a book natively: named head + tag + tail, released by "
     "timeline.at(now + entry_delay) (drawn: at(now + entry_delay, tag), the start's own draws; None: untimed), "
     "`program` loaded, `conns` (one per program pair; `index` is "
     "conn's) connected, then the frame fed. Python adopts it by `token` (take_started). `guesses`: a start may "
     "post the next instance's first receives once the starter's instances repeat (guess_ahead)."},
    {"clear_starters", core_clear_starters, METH_NOARGS,
     "clear_starters(): no native start from now on (and no arm left)."},
    {"arm", core_arm, METH_VARARGS,
     "arm(id, tag): the instance of this tag may start from a starter added with arm=id; the oldest of a few "
     "hundred arms go first."},
    {"note", core_note, METH_VARARGS,
     "note(id, tag, now, group, rank) -> bool: real rank `rank`'s call in `group` noted the instance of this "
     "tag the shape of the starters added with note=id; one of them starts it now, before its frames (False: "
     "none may: the tag is not the one after the rank's latest collective's, none of that note, or the "
     "instance runs already or is Python's)."},
    {"watch_notes", core_watch_notes, METH_VARARGS,
     "watch_notes(fd, rank, early=b''): the loop reads real rank `rank`'s note link natively (one line a noted "
     "call: group, tag, kind, numel, dtype, tab-separated); `early`: its bytes read before."},
    {"unwatch_notes", core_unwatch_notes, METH_O, "unwatch_notes(fd) -> bool: stop (before the socket closes)."},
    {"know_note", core_know_note, METH_VARARGS,
     "know_note(group, kind, numel, dtype, note, arm): a note of this shape read on a note link starts the "
     "starters added with note=`note` (if its tag is the one after its rank's latest collective's), else arms "
     "those added with arm=`arm` (-1: none); forgotten with the starters."},
    {"guess_ahead", core_set_guess_ahead, METH_O,
     "guess_ahead(on): whether a starter whose instances repeat at a steady tag step posts its next instance's "
     "first receives with one's last sends (Guesses, in book_bindings.cc)."},
    {"note_starts", core_set_note_starts, METH_O,
     "note_starts(on): whether a known noted shape starts as its note is read (else it is only armed)."},
    {"take_notes", core_take_notes, METH_NOARGS,
     "take_notes() -> [(rank, group, tag, kind, numel, dtype, known)] (or ()): the notes read since the last "
     "call; known: the core started or armed it as Python would."},
    {"polled", core_polled, METH_NOARGS,
     "polled() -> seconds the loop spent in its busy window's polls that found nothing (its CPU, not its work)."},
    {"in_flight", core_in_flight, METH_NOARGS,
     "in_flight() -> the books not finished, complete nor closed (wait puts Python's idle work off while any are)."},
    {"take_started", core_take_started, METH_NOARGS,
     "take_started() -> [(token, book)] (or ()): the books started natively since the last call (their owner is None)."},
    {"watch", core_watch, METH_VARARGS, "watch(fd, conn, label): the loop reads this pair socket natively."},
    {"unwatch", core_unwatch, METH_O, "unwatch(fd) -> bool: stop (before the socket closes)."},
    {"write_wanted", core_write_wanted, METH_O,
     "write_wanted(fd) -> bool: frames wait for the watched socket; the loop writes them when it can."},
    {"also", core_also, METH_O, "also(fd): Python's own epoll; wait() returns when it is readable."},
    {"wait", core_wait, METH_VARARGS,
     "wait(until, idle=False, busy=0.0, spin=0.0, hold=True) -> ([(conn, events | None)], python): run the pair sockets and native "
     "timers natively until Python has events, its own epoll is readable, or `until` (monotonic seconds); when "
     "Python has idle work (idle, or books started natively), also once nothing is ready. For `busy` s after a "
     "pair event or release the loop polls, and idle work waits; for `spin` s it polls, idle work done. While a "
     "book is in flight (`hold`), idle work waits for a gap between collectives, a release far off, or 1 ms quiet."},
    {nullptr, nullptr, 0, nullptr},
};

// -- Book ------------------------------------------------------------------------------
int book_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"core",    "owner",  "name",        "slot", "timeline",
                             "payload", "extend", "turnarounds", nullptr};
  PyObject *core, *owner, *timeline, *payload = Py_None, *extend = Py_None;
  const char* name;
  unsigned long long slot;
  int turnarounds = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OsKO|OOp", const_cast<char**>(kw), &CoreType, &core, &owner,
                                   &name, &slot, &timeline, &payload, &extend, &turnarounds)) {
    return -1;
  }
  auto* self = reinterpret_cast<BookObject*>(obj);
  if (self->book != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a Book is initialized once");
    return -1;
  }
  try {
    std::shared_ptr<ReleaseClock> clock;
    const timing::TimingApi* api = timeline != Py_None ? timing_api() : nullptr;
    int kind = 0;
    void* native = api != nullptr ? api->native_of(timeline, &kind) : nullptr;
    if (native != nullptr) {
      clock = std::make_shared<NativeClock>(timeline, api, native, kind);
    } else if (timeline != Py_None) {
      PyObject* release = PyObject_GetAttrString(timeline, "release");
      PyObject* sent = release != nullptr ? PyObject_GetAttrString(timeline, "real_sent") : nullptr;
      if (sent != nullptr) clock = std::make_shared<PyClock>(release, sent);
      Py_XDECREF(release);
      Py_XDECREF(sent);
      if (!clock) return -1;  // a timeline without release() and real_sent()
    }
    std::shared_ptr<PayloadSource> source;
    if (payload != Py_None) source = std::make_shared<PySource>(payload);
    std::shared_ptr<ProgramExtension> extension;
    if (extend != Py_None) extension = std::make_shared<PyExtension>(extend);
    self->book = new Book(name, slot, std::move(clock), std::move(source), std::move(extension));
    if (turnarounds != 0) self->book->time_turnarounds();
    self->conns = new std::vector<PyObject*>();
    self->pairs = new std::vector<PairObject*>();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  Py_INCREF(core);
  Py_INCREF(owner);
  self->core = reinterpret_cast<CoreObject*>(core);
  ++self->core->in_flight;
  self->owner = owner;
  return 0;
}

void unroute(BookObject* self) {
  if (!self->routed || self->pairs == nullptr) return;
  for (PairObject* po : *self->pairs) {
    if (po == nullptr) continue;
    auto& r = *po->routes;
    r.erase(std::remove_if(r.begin(), r.end(), [&](const Route& x) { return x.book == reinterpret_cast<PyObject*>(self); }),
            r.end());
  }
  self->routed = false;
}

void book_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  unroute(self);
  delete self->book;
  if (self->conns != nullptr) {
    for (PyObject* c : *self->conns) Py_XDECREF(c);
    delete self->conns;
  }
  if (self->pairs != nullptr) {
    for (PairObject* p : *self->pairs) Py_XDECREF(reinterpret_cast<PyObject*>(p));
    delete self->pairs;
  }
  Py_CLEAR(self->owner);
  book_finish(self);
  Py_XDECREF(reinterpret_cast<PyObject*>(self->core));
  Py_TYPE(obj)->tp_free(obj);
}

bool book_ready(BookObject* self) {
  if (self->book == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Book.__init__ was not called");
    return false;
  }
  if (g_protocol_error == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuronabox.controller._native.bind_book() was not called");
    return false;
  }
  return true;
}

PyObject* book_add_pair(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  long long real, emu;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "LL", &real, &emu)) return nullptr;
  self->conns->push_back(nullptr);  // until the pair's connection opens (connect)
  self->pairs->push_back(nullptr);
  return PyLong_FromSize_t(self->book->add_pair(real, emu));
}

bool parse_refs(PyObject* seq, std::vector<SendRef>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of (rank, step)");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long rank, step;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "LL", &rank, &step)) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(SendRef{rank, step});
  }
  Py_DECREF(fast);
  return true;
}

bool valid_pair(BookObject* self, Py_ssize_t i) {
  if (i < 0 || static_cast<size_t>(i) >= self->book->pairs()) {
    PyErr_Format(PyExc_IndexError, "no pair %zd in the book", i);
    return false;
  }
  return true;
}

PyObject* book_expect_send(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  Py_ssize_t i;
  long long step, nbytes, limit, post_len;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "nLLLL", &i, &step, &nbytes, &limit, &post_len)) return nullptr;
  if (!valid_pair(self, i)) return nullptr;
  self->book->expect_real_send(static_cast<size_t>(i), step, nbytes, limit, post_len);
  Py_RETURN_NONE;
}

PyObject* book_expect_recv(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  Py_ssize_t i;
  long long step, nbytes, limit;
  PyObject *deps_obj, *content_obj;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "nLLLOO", &i, &step, &nbytes, &limit, &deps_obj, &content_obj)) {
    return nullptr;
  }
  if (!valid_pair(self, i)) return nullptr;
  std::vector<SendRef> deps, content;
  if (!parse_refs(deps_obj, &deps) || !parse_refs(content_obj, &content)) return nullptr;
  self->book->expect_real_recv(static_cast<size_t>(i), step, nbytes, limit, std::move(deps), std::move(content));
  Py_RETURN_NONE;
}

// -- Program ---------------------------------------------------------------------------
int program_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  if (!PyArg_ParseTuple(args, ":Program") || (kwargs != nullptr && PyDict_Size(kwargs) > 0)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Program() takes no arguments");
    return -1;
  }
  auto* self = reinterpret_cast<ProgramObject*>(obj);
  if (self->program != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a Program is initialized once (books may hold it)");
    return -1;
  }
  self->program = new (std::nothrow) std::shared_ptr<Program>(std::make_shared<Program>());
  if (self->program == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

void program_dealloc(PyObject* obj) {
  delete reinterpret_cast<ProgramObject*>(obj)->program;
  Py_TYPE(obj)->tp_free(obj);
}

Program* program_of(PyObject* obj) {
  std::shared_ptr<Program>* p = reinterpret_cast<ProgramObject*>(obj)->program;
  if (p == nullptr) PyErr_SetString(PyExc_RuntimeError, "Program.__init__ was not called");
  return p != nullptr ? p->get() : nullptr;
}

// The program, to add to: not once a book reads it.
Program* growing(PyObject* obj) {
  if (reinterpret_cast<ProgramObject*>(obj)->sealed) {
    PyErr_SetString(PyExc_RuntimeError, "the program is loaded into a book: it is complete");
    return nullptr;
  }
  return program_of(obj);
}

bool valid_program_pair(const Program& p, Py_ssize_t i) {
  if (i < 0 || static_cast<size_t>(i) >= p.pairs.size()) {
    PyErr_Format(PyExc_IndexError, "no pair %zd in the program", i);
    return false;
  }
  return true;
}

PyObject* program_add_pair(PyObject* obj, PyObject* args) {
  Program* p = growing(obj);
  long long real, emu;
  if (p == nullptr || !PyArg_ParseTuple(args, "LL", &real, &emu)) return nullptr;
  p->pairs.emplace_back(real, emu);
  return PyLong_FromSize_t(p->pairs.size() - 1);
}

PyObject* program_expect_send(PyObject* obj, PyObject* args) {
  Program* p = growing(obj);
  Py_ssize_t i;
  long long step, nbytes, limit, post_len;
  if (p == nullptr || !PyArg_ParseTuple(args, "nLLLL", &i, &step, &nbytes, &limit, &post_len)) return nullptr;
  if (!valid_program_pair(*p, i)) return nullptr;
  p->ops.push_back(Program::Op{static_cast<size_t>(i), true, step, nbytes, limit, post_len, {}, {}});
  Py_RETURN_NONE;
}

PyObject* program_expect_recv(PyObject* obj, PyObject* args) {
  Program* p = growing(obj);
  Py_ssize_t i;
  long long step, nbytes, limit;
  PyObject *deps_obj, *content_obj;
  if (p == nullptr || !PyArg_ParseTuple(args, "nLLLOO", &i, &step, &nbytes, &limit, &deps_obj, &content_obj)) {
    return nullptr;
  }
  if (!valid_program_pair(*p, i)) return nullptr;
  std::vector<SendRef> deps, content;
  if (!parse_refs(deps_obj, &deps) || !parse_refs(content_obj, &content)) return nullptr;
  p->ops.push_back(Program::Op{static_cast<size_t>(i), false, step, nbytes, limit, -1, std::move(deps),
                               std::move(content)});
  Py_RETURN_NONE;
}

// A sequence of ints, read once into a vector.
bool int64s(PyObject* obj, const char* what, std::vector<int64_t>* out) {
  PyObject* fast = PySequence_Fast(obj, what);
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->resize(static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    (*out)[static_cast<size_t>(k)] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

PyObject* program_expect_sends(PyObject* obj, PyObject* args) {
  Program* p = growing(obj);
  Py_ssize_t i;
  PyObject* msgs;
  if (p == nullptr || !PyArg_ParseTuple(args, "nO", &i, &msgs) || !valid_program_pair(*p, i)) return nullptr;
  PyObject* fast = PySequence_Fast(msgs, "expected a sequence of messages");
  if (fast == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  p->ops.reserve(p->ops.size() + static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    int64_t peer, step, nbytes;
    if (!parse_msg(PySequence_Fast_GET_ITEM(fast, k), &peer, &step, &nbytes)) {
      Py_DECREF(fast);
      return nullptr;
    }
    p->ops.push_back(Program::Op{static_cast<size_t>(i), true, step, nbytes, nbytes, nbytes, {}, {}});
  }
  Py_DECREF(fast);
  Py_RETURN_NONE;
}

PyObject* program_expect_recvs_upstream(PyObject* obj, PyObject* args) {
  Program* p = growing(obj);
  Py_ssize_t i;
  long long x;
  PyObject *steps_obj, *nbytes_obj, *data_obj, *wait_obj;
  if (p == nullptr || !PyArg_ParseTuple(args, "nOOLOO", &i, &steps_obj, &nbytes_obj, &x, &data_obj, &wait_obj) ||
      !valid_program_pair(*p, i)) {
    return nullptr;
  }
  std::vector<int64_t> steps, nbytes, data, wait;
  if (!int64s(steps_obj, "steps: a sequence of ints", &steps) || !int64s(nbytes_obj, "nbytes: ints", &nbytes) ||
      !int64s(data_obj, "data: ints", &data) || !int64s(wait_obj, "wait: ints", &wait)) {
    return nullptr;
  }
  const size_t n = steps.size();
  if (nbytes.size() != n || data.size() != n || wait.size() != n) {
    PyErr_SetString(PyExc_ValueError, "steps, nbytes, data and wait differ in length");
    return nullptr;
  }
  p->ops.reserve(p->ops.size() + n);
  for (size_t k = 0; k < n; ++k) {
    if (nbytes[k] < 0) {
      PyErr_Format(PyExc_ValueError, "a receive at step %lld whose length only the wire tells: add it alone",
                   static_cast<long long>(steps[k]));
      return nullptr;
    }
    std::vector<SendRef> deps, content;
    if (data[k] >= 0) {
      content.push_back(SendRef{x, data[k]});
      deps.push_back(content.back());
    }
    if (wait[k] >= 0) deps.push_back(SendRef{x, wait[k]});
    p->ops.push_back(Program::Op{static_cast<size_t>(i), false, steps[k], nbytes[k], nbytes[k], -1, std::move(deps),
                                 std::move(content)});
  }
  Py_RETURN_NONE;
}

PyObject* refs_list(const std::vector<SendRef>& refs) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(refs.size()));
  if (list == nullptr) return nullptr;
  for (size_t k = 0; k < refs.size(); ++k) {
    PyObject* t = Py_BuildValue("(LL)", static_cast<long long>(refs[k].rank), static_cast<long long>(refs[k].step));
    if (t == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), t);
  }
  return list;
}

PyObject* program_ops(PyObject* obj, PyObject*) {
  Program* p = program_of(obj);
  if (p == nullptr) return nullptr;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(p->ops.size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < p->ops.size(); ++k) {
    const Program::Op& op = p->ops[k];
    PyObject* deps = refs_list(op.deps);
    PyObject* content = deps != nullptr ? refs_list(op.content) : nullptr;
    PyObject* row = content != nullptr ? Py_BuildValue("(snLLLLNN)", op.real_sends ? "send" : "recv",
                                                       static_cast<Py_ssize_t>(op.pair), static_cast<long long>(op.step),
                                                       static_cast<long long>(op.nbytes), static_cast<long long>(op.limit),
                                                       static_cast<long long>(op.post_len), deps, content)
                                        : nullptr;
    if (row == nullptr) {
      if (content == nullptr) Py_XDECREF(deps);
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), row);
  }
  return out;
}

PyObject* program_len(PyObject* obj, void*) {
  Program* p = program_of(obj);
  return p != nullptr ? PyLong_FromSize_t(p->ops.size()) : nullptr;
}

PyMethodDef program_methods[] = {
    {"add_pair", program_add_pair, METH_VARARGS, "add_pair(real, emu) -> int: as Book.add_pair."},
    {"expect_send", program_expect_send, METH_VARARGS, "expect_send(pair, step, nbytes, limit, post_len): as Book's."},
    {"expect_recv", program_expect_recv, METH_VARARGS,
     "expect_recv(pair, step, nbytes, limit, deps, content): as Book's."},
    {"ops", program_ops, METH_NOARGS,
     "ops() -> [(\"send\"|\"recv\", pair, step, nbytes, limit, post_len, deps, content)]: what it holds, in order."},
    {"expect_sends", program_expect_sends, METH_VARARGS,
     "expect_sends(pair, msgs): expect_send of each (peer, step, nbytes) message, its length known (limit and "
     "post_len too), at once."},
    {"expect_recvs_upstream", program_expect_recvs_upstream, METH_VARARGS,
     "expect_recvs_upstream(pair, steps, nbytes, x, data, wait): expect_recv of each receive (sequences of ints), its "
     "length known; its emulated send carries real rank x's send at data[k] and waits for it and for x's send at "
     "wait[k] (-1: none), as a ring's upstream() gives them."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* program_get_window(PyObject* obj, void*) {
  Program* p = program_of(obj);
  return p != nullptr ? PyLong_FromLongLong(p->post_window) : nullptr;
}

int program_set_window(PyObject* obj, PyObject* value, void*) {
  Program* p = growing(obj);
  if (p == nullptr) return -1;
  const long long n = value != nullptr ? PyLong_AsLongLong(value) : -1;
  if (n == -1 && PyErr_Occurred()) return -1;
  if (n < 0) {
    PyErr_SetString(PyExc_ValueError, "post_window is 0 (every receive at once) or more");
    return -1;
  }
  p->post_window = n;
  return 0;
}

PyGetSetDef program_getset[] = {
    {"messages", program_len, nullptr, "boundary messages the program has", nullptr},
    {"post_window", program_get_window, program_set_window,
     "receives the emulated side keeps posted per pair, the next as one fills (0: every one at once)", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

bool load_into(BookObject* self, PyObject* program);

PyObject* book_load(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  if (!book_ready(self)) return nullptr;
  if (!PyObject_TypeCheck(arg, &ProgramType)) {
    PyErr_SetString(PyExc_TypeError, "Book.load takes a Program");
    return nullptr;
  }
  Program* p = program_of(arg);
  if (p == nullptr) return nullptr;
  if (self->book->pairs() != 0) {
    PyErr_SetString(PyExc_RuntimeError, "a program is loaded into an empty book");
    return nullptr;
  }
  if (!load_into(self, arg)) return nullptr;
  Py_RETURN_NONE;
}

// Pair k's connection is open: route its frames here and post its receives (each one's
// (slot, length) appended to `journal`, if given). False: a Python error is set.
bool connect_pair(BookObject* self, size_t k, PyObject* conn,
                  std::vector<std::pair<uint64_t, uint64_t>>* journal = nullptr) {
  if ((*self->conns)[k] != nullptr) {
    PyErr_Format(PyExc_RuntimeError, "pair %zu of the book is connected already", k);
    return false;
  }
  if (self->finished) return true;
  PyObject* pair = PyObject_GetAttrString(conn, "pair");
  if (pair == nullptr) return false;
  if (!PyObject_TypeCheck(pair, &PairType)) {
    Py_DECREF(pair);
    PyErr_SetString(PyExc_TypeError, "a book's connection must carry a native pair (conn.pair)");
    return false;
  }
  Py_INCREF(conn);
  (*self->conns)[k] = conn;
  auto* po = reinterpret_cast<PairObject*>(pair);  // the reference GetAttr gave
  (*self->pairs)[k] = po;
  PyObject* obj = reinterpret_cast<PyObject*>(self);
  po->routes->push_back(Route{self->book->slot(), obj, k});
  self->routed = true;
  Py_INCREF(obj);  // the book's own hooks may drop the last other reference
  po->pair->set_journal(journal);
  const bool ok = run_book(self, [&](Actions& a) { self->book->connect(k, po->pair, a); });
  po->pair->set_journal(nullptr);
  Py_DECREF(obj);
  return ok;
}

PyObject* book_connect(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  Py_ssize_t i;
  PyObject* conn;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "nO", &i, &conn) || !valid_pair(self, i)) return nullptr;
  if (!connect_pair(self, static_cast<size_t>(i), conn)) return nullptr;
  Py_RETURN_NONE;
}

// loads `program` (a Program) into an empty book.
bool load_into(BookObject* self, PyObject* program) {
  Program* p = program_of(program);
  if (p == nullptr) return false;
  try {
    self->conns->resize(p->pairs.size(), nullptr);  // until each pair's connection opens (connect)
    self->pairs->resize(p->pairs.size(), nullptr);
    reinterpret_cast<ProgramObject*>(program)->sealed = true;
    self->book->load(*reinterpret_cast<ProgramObject*>(program)->program);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return false;
  }
  return true;
}

PyObject* book_adopt(PyObject* obj, PyObject* owner) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  if (!book_ready(self)) return nullptr;
  if (self->finished) Py_RETURN_FALSE;  // done before its adoption: the adopter completes it
  Py_INCREF(owner);
  Py_XSETREF(self->owner, owner);
  Py_RETURN_TRUE;
}

// One frame's event, whichever side read it.
struct Frame {
  gloo::EventKind kind;
  uint64_t slot;
  uint64_t length;
  BytesRef payload;  // kData only
};

// One event for pair `i`: from the dialect's Python event, or natively from `dispatch`.
bool feed(BookObject* self, size_t i, Frame& ev, double now) {
  if (self->finished) {
    PyErr_Format(g_protocol_error, "a frame on slot %llu after its collective completed",
                 static_cast<unsigned long long>(ev.slot));
    return false;
  }
  Py_INCREF(self);
  const bool ok = run_book(self, [&](Actions& a) {
    switch (ev.kind) {
      case gloo::EventKind::kRecvReady:
        self->book->on_recv_ready(i, ev.length, now, a);
        break;
      case gloo::EventKind::kSendReady:
        self->book->on_send_ready(i, ev.length, now, a);
        break;
      default:
        self->book->on_data(i, std::move(ev.payload), now, a);
    }
  });
  Py_DECREF(self);
  return ok;
}

// A Python event (the dialect's NamedTuple) as a Frame.
bool to_frame(PyObject* ev, Frame* out) {
  if (!PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) != 2) {
    PyErr_SetString(PyExc_TypeError, "expected a dialect event");
    return false;
  }
  out->slot = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ev, 0));
  if (PyErr_Occurred()) return false;
  PyTypeObject* t = Py_TYPE(ev);
  if (t == g_data) {
    out->kind = gloo::EventKind::kData;
    if (!as_bytes_ref(PyTuple_GET_ITEM(ev, 1), &out->payload)) return false;
    out->length = out->payload->size();
    return true;
  }
  if (t != g_recv_ready && t != g_send_ready) {
    PyErr_SetString(PyExc_TypeError, "expected RecvReady, SendReady or Data");
    return false;
  }
  out->kind = t == g_recv_ready ? gloo::EventKind::kRecvReady : gloo::EventKind::kSendReady;
  out->length = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(ev, 1));
  return !PyErr_Occurred();
}

PyObject* book_on_event(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  Py_ssize_t i;
  PyObject* ev;
  double now;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "nOd", &i, &ev, &now) || !valid_pair(self, i)) return nullptr;
  Frame f{};
  if (!to_frame(ev, &f) || !feed(self, static_cast<size_t>(i), f, now)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* book_due(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  Py_ssize_t i;
  double now;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "nd", &i, &now) || !valid_pair(self, i)) return nullptr;
  return book_call(self, [&](Actions& a) { self->book->due(static_cast<size_t>(i), now, a); });
}

PyObject* book_post(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  const Py_ssize_t i = PyLong_AsSsize_t(arg);
  if (!book_ready(self) || (i == -1 && PyErr_Occurred()) || !valid_pair(self, i)) return nullptr;
  return book_call(self, [&](Actions& a) { self->book->post(static_cast<size_t>(i), a); });
}

PyObject* book_arrive(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  long long rank, step;
  double now;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "LLd", &rank, &step, &now)) return nullptr;
  return book_call(self, [&](Actions& a) { self->book->arrive(SendRef{rank, step}, now, a); });
}

PyObject* book_hold(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  const long long n = PyLong_AsLongLong(arg);
  if (!book_ready(self) || (n == -1 && PyErr_Occurred())) return nullptr;
  self->book->hold(n);
  Py_RETURN_NONE;
}

PyObject* book_settle(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  long long n;
  double now;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "Ld", &n, &now)) return nullptr;
  return book_call(self, [&](Actions& a) { self->book->settle(n, now, a); });
}

PyObject* book_received(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  long long rank, step;
  if (!book_ready(self) || !PyArg_ParseTuple(args, "LL", &rank, &step)) return nullptr;
  BytesRef ref = self->book->received(SendRef{rank, step});
  if (!ref) {
    PyErr_Format(PyExc_KeyError, "real rank %lld's send at step %lld has not crossed", rank, step);
    return nullptr;
  }
  return payload_wrap(std::move(ref));
}

PyObject* book_close(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  unroute(self);
  if (self->book != nullptr) {
    self->book->drop_hooks();
    if (!self->finished) self->book->drop_payloads();  // a completed book let go of them already (apply)
  }
  book_finish(self);
  Py_CLEAR(self->owner);
  Py_RETURN_NONE;
}

PyObject* book_rank_times(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  if (!book_ready(self)) return nullptr;
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  for (const auto& [rank, t] : self->book->rank_times()) {
    PyObject* k = PyLong_FromLongLong(rank);
    PyObject* v = Py_BuildValue("(dd)", t.first, t.second);
    if (k == nullptr || v == nullptr || PyDict_SetItem(d, k, v) != 0) {
      Py_XDECREF(k);
      Py_XDECREF(v);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(k);
    Py_DECREF(v);
  }
  return d;
}

PyObject* book_lag(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  if (!book_ready(self)) return nullptr;
  if (!self->book->lagged()) Py_RETURN_NONE;
  return PyFloat_FromDouble(self->book->lag());
}

PyObject* float_list(const std::vector<double>& xs) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(xs.size()));
  if (list == nullptr) return nullptr;
  for (size_t k = 0; k < xs.size(); ++k) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyFloat_FromDouble(xs[k]));
  return list;
}

PyObject* book_take_lateness(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? float_list(self->book->take_lateness()) : nullptr;
}

PyObject* book_take_turnarounds(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? float_list(self->book->take_turnarounds()) : nullptr;
}

PyObject* book_remaining(PyObject* obj, void*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? PyLong_FromLongLong(self->book->remaining()) : nullptr;
}

PyObject* book_boundary(PyObject* obj, void*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? PyLong_FromLongLong(self->book->boundary()) : nullptr;
}

PyObject* book_done_at(PyObject* obj, void*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? PyFloat_FromDouble(self->book->done_at()) : nullptr;
}

PyObject* book_held(PyObject* obj, void*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? PyLong_FromSize_t(self->book->held_bytes()) : nullptr;
}

PyObject* book_posted_ahead(PyObject* obj, void*) {
  return PyBool_FromLong(reinterpret_cast<BookObject*>(obj)->posted_ahead);
}

PyObject* book_on_note(PyObject* obj, void*) {
  return PyBool_FromLong(reinterpret_cast<BookObject*>(obj)->on_note);
}

PyObject* book_slot(PyObject* obj, void*) {
  auto* self = reinterpret_cast<BookObject*>(obj);
  return book_ready(self) ? PyLong_FromUnsignedLongLong(self->book->slot()) : nullptr;
}

PyMethodDef book_methods[] = {
    {"add_pair", book_add_pair, METH_VARARGS, "add_pair(real, emu) -> int: a pair of the instance's boundary."},
    {"expect_send", book_expect_send, METH_VARARGS,
     "expect_send(pair, step, nbytes, limit, post_len): the real rank sends at `step` (nbytes < 0: the wire tells, at "
     "most `limit`); the emulated receive is posted with `post_len` (< 0: once the notice tells)."},
    {"expect_recv", book_expect_recv, METH_VARARGS,
     "expect_recv(pair, step, nbytes, limit, deps, content): the real rank receives at `step`; the emulated send waits "
     "for `deps` and carries `content`'s bytes ((rank, step) pairs; none: zeros)."},
    {"load", book_load, METH_O, "load(program): every pair and message of a recorded Program, into an empty book."},
    {"adopt", book_adopt, METH_O,
     "adopt(owner) -> bool: a book started natively gets its instance; False: it completed before (the adopter "
     "completes the instance)."},
    {"connect", book_connect, METH_VARARGS,
     "connect(pair, conn): the pair's connection is open: post its receives, take its frames natively."},
    {"on_event", book_on_event, METH_VARARGS, "on_event(pair, event, now): a frame the driver read in Python."},
    {"due", book_due, METH_VARARGS, "due(pair, now): a release timer for the pair fired."},
    {"post", book_post, METH_O, "post(pair): post the receives the program gained, on a connected pair."},
    {"arrive", book_arrive, METH_VARARGS,
     "arrive(rank, step, now): something sends wait on, not a boundary message, is in (a mirrored input)."},
    {"hold", book_hold, METH_O, "hold(n): n placeholders to settle before the instance is done."},
    {"settle", book_settle, METH_VARARGS, "settle(n, now): n placeholders settled."},
    {"received", book_received, METH_VARARGS, "received(rank, step) -> Payload: a real send's bytes."},
    {"close", book_close, METH_NOARGS, "close(): stop taking frames; drop the owner."},
    {"rank_times", book_rank_times, METH_NOARGS, "rank_times() -> {real rank: (first frame, last crossed)}."},
    {"take_lateness", book_take_lateness, METH_NOARGS, "take_lateness() -> [seconds]: how late each timed release left."},
    {"take_turnarounds", book_take_turnarounds, METH_NOARGS,
     "take_turnarounds() -> [seconds]: each real send notice's time since the book's latest write to that rank."},
    {"lag", book_lag, METH_NOARGS, "lag() -> seconds or None: how long the latest priced send left after its release and its inputs."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef book_getset[] = {
    {"remaining", book_remaining, nullptr, "boundary messages not yet crossed", nullptr},
    {"boundary", book_boundary, nullptr, "boundary messages the program has", nullptr},
    {"done_at", book_done_at, nullptr, "when the last one crossed", nullptr},
    {"held", book_held, nullptr, "bytes of the real sends it still holds (0 once it completed or closed)", nullptr},
    {"slot", book_slot, nullptr, "the instance's slot", nullptr},
    {"posted_ahead", book_posted_ahead, nullptr, "started natively after a receive of its was posted ahead", nullptr},
    {"on_note", book_on_note, nullptr, "started natively as its call's note came, before its frames", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* bind_book(PyObject*, PyObject* err) {
  Py_INCREF(err);
  Py_XSETREF(g_protocol_error, err);
  Py_RETURN_NONE;
}

PyMethodDef book_module_methods[] = {
    {"bind_book", bind_book, METH_O, "bind_book(ProtocolError): the engine's error for a frame the schedule lacks."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

namespace {

// A first frame with no book: if a starter of the pair's core matches it, its book is made,
// loaded, connected and fed here. 1: started; 0: no starter matches; -1: a Python error is set.
// Holds a copy of a starter's objects while a start runs: connecting a pair may reach Python
// (a write to a pair with no socket), which may change the core's starters.
class HeldStarter {
 public:
  explicit HeldStarter(const Starter& st) : st_(st) {
    for (PyObject* o : objects()) Py_XINCREF(o);
  }
  ~HeldStarter() {
    for (PyObject* o : objects()) Py_XDECREF(o);
  }
  HeldStarter(const HeldStarter&) = delete;
  HeldStarter& operator=(const HeldStarter&) = delete;
  const Starter& get() const { return st_; }

 private:
  std::vector<PyObject*> objects() const {
    std::vector<PyObject*> all{reinterpret_cast<PyObject*>(st_.pair), st_.program, st_.token, st_.timeline};
    all.insert(all.end(), st_.conns.begin(), st_.conns.end());
    return all;
  }
  Starter st_;
};

// A frame no book takes goes to Python, and the pair remembers its slot.
void hand_to_python(PairObject* po, gloo::Event&& ev, std::vector<gloo::Event>* rest) {
  const uint32_t n = po->handed_n;
  if (n == 0 || po->handed[(n - 1) % kHandedKept] != ev.slot) po->handed[po->handed_n++ % kHandedKept] = ev.slot;
  rest->push_back(std::move(ev));
}

bool handed(const PairObject* po, uint64_t slot) {
  const uint32_t kept = std::min(po->handed_n, kHandedKept);
  return std::find(po->handed, po->handed + kept, slot) != po->handed + kept;
}

// Whether a frame of `slot` went to Python on a pair of `st`'s program: 1 yes, 0 no, -1
// with a Python error set. The loop serves every ready pair before Python's turn, so one
// pair's notice may wait for Python while another's matches a starter in the same batch.
// 1 if `holds(pair)` for one of the starter's native pairs, 0 if for none, -1 with a Python error set.
template <class F>
int any_pair(const Starter& st, F holds) {
  for (PyObject* conn : st.conns) {
    PyObject* pair = PyObject_GetAttrString(conn, "pair");
    if (pair == nullptr) return -1;
    const bool found = PyObject_TypeCheck(pair, &PairType) && holds(reinterpret_cast<PairObject*>(pair));
    Py_DECREF(pair);
    if (found) return 1;
  }
  return 0;
}

int python_has(const Starter& st, uint64_t slot) {
  return any_pair(st, [slot](PairObject* po) { return handed(po, slot); });
}

// What a drawn start tells the skew of the books started natively and not adopted yet
// (Python hears of their ends only at adoption): inf while one of them runs, else when the
// latest real rank's last message of theirs crossed; -1 when there are none (Skew.entry).
double unadopted_end(const CoreObject* core) {
  double end = -1.0;
  for (const auto& [token, obj] : *core->started) {
    const auto* b = reinterpret_cast<const BookObject*>(obj);
    if (!b->finished) return std::numeric_limits<double>::infinity();
    for (const auto& [rank, times] : b->book->rank_times()) end = std::max(end, times.second);
  }
  return end;
}

// -- Guesses ---------------------------------------------------------------------------
// A real peer that enters a collective before the real rank has its receive notices in by
// the time the real rank's sends are posted, and Gloo's pair then writes each send from
// the calling thread. The emulated peer hears of a call only from its note or first
// frame, after the real rank has posted its sends, so Gloo's read thread writes them a
// step later (docs/fidelity.md, "The emulated peer never leads"). A repeating shape tells
// what comes next: the same starter, its tag `step` past the last. Once a starter's
// instances came kGuessStreak times in a row `step` apart, each of its instances posts the
// next one's first receives (its own first receives, on the next tag's slot) in the write
// of its last emulated sends (post_guesses). Gloo counts a peer's receive notices per slot,
// with no length (transport/tcp/pair.cc, handleRemotePendingRecv), so a right guess lets the real
// rank's first sends go at once, and what they carry is held with the slot until its book
// starts (a Pending, as for Starter::post_ahead). A wrong one leaves a count in the real
// rank's map and a posted receive in ours: the latter is forgotten once the rank's frames
// are kGuessAge collectives past it, and the starter waits for twice the streak before
// it guesses again (at most kGuessStreakMax), so an irregular pattern soon stops guessing.
constexpr int kGuessStreak = 2;
constexpr int kGuessStreakMax = 64;
constexpr uint64_t kGuessStepMax = 64;  // tags between instances a guess spans at most
constexpr uint64_t kGuessAge = 64;      // collectives past a guess's tag before it is forgotten
constexpr size_t kGuessesKept = 16;     // unclaimed guesses a pair holds at most
// The largest receive a guess posts. A guessed send is written from the real rank's calling
// thread before it posts its own receive notices, which the emulated sends wait for; a small
// one takes microseconds, a large one holds them back (W = 2, best repetitions guessed
// against not: allreduce 1 and 16 KiB 4-7% faster, 256 KiB even, 1 and 4 MiB 7% and 23%
// slower; docs/fidelity.md, "Receives posted on a guess").
constexpr uint64_t kGuessBytesMax = 64 * 1024;

// Forgets the guesses no book took whose tag the real rank's frames passed by kGuessAge.
void expire_guesses(CoreObject* core) {
  auto& pend = *core->pending;
  for (auto it = pend.begin(); it != pend.end();) {
    const int64_t last = it->pair->last_tag != nullptr ? **it->pair->last_tag : -1;
    const uint64_t behind = (static_cast<uint64_t>(last) - it->tag) & 0xFFFFFFFFu;
    if (!it->guess || !it->events.empty() || !it->data.empty() || last < 0 || behind < kGuessAge ||
        behind >= 0x80000000u) {
      ++it;
      continue;
    }
    it->pair->pair->forget_guess(it->slot);  // false: a book took it, and only the entry is left
    Py_DECREF(reinterpret_cast<PyObject*>(it->pair));
    it = pend.erase(it);
  }
}

// Instance `tag` of `st` (first slot `slot`) starts, as book `b`: settles its starter's
// last guess, and counts the instance into the starter's streak.
void settle_plan(CoreObject* core, const Starter& st, uint64_t tag, uint64_t slot, BookObject* b) {
  if (!core->guess_ahead || !st.guesses || core->sink != nullptr || st.plan >= core->plans->size()) return;
  AheadPlan& p = (*core->plans)[st.plan];
  if (p.need == 0) p.need = kGuessStreak;
  if (p.guessed >= 0 && static_cast<uint64_t>(p.guessed) != tag) {  // wrong: guess less readily
    p.streak = 0;
    p.need = std::min(2 * p.need, kGuessStreakMax);
  }
  p.guessed = -1;
  if (p.last_tag >= 0) {
    const uint64_t d = (tag - static_cast<uint64_t>(p.last_tag)) & st.tag_mask;
    p.streak = d == p.step ? p.streak + 1 : 1;
    p.step = d;
  }
  p.last_tag = static_cast<int64_t>(tag);
  p.slot = slot;
  p.tag_shift = st.tag_shift;
  p.tag_mask = st.tag_mask;
  b->planned = true;
  b->plan = st.plan;
  b->plans_gen = core->plans_gen;
  b->tag = tag;
}

// Book `b` has frames queued on the pairs `dirty`, not flushed yet. Once they are its last
// emulated sends on each pair its next instance receives on (the book has none to come or
// queued there), and its starter repeats, that instance's first receives go in the same
// writes: the real rank reads them with data it waits for, not in a wake-up of their own
// (posted as an instance started, they came in the middle of its call, and 28-byte and 256
// KiB rings read 7-28% slower than with no guesses).
void post_guesses(CoreObject* core, BookObject* b, const std::vector<size_t>& dirty) {
  if (!b->planned || b->plans_gen != core->plans_gen || b->plan >= core->plans->size() || !core->guess_ahead) return;
  AheadPlan& p = (*core->plans)[b->plan];
  if (p.guessed >= 0 || p.last_tag != static_cast<int64_t>(b->tag) || p.streak < p.need || p.step == 0 ||
      p.step > kGuessStepMax || p.recvs.empty()) {
    return;  // (posted already; a later instance of its starter began meanwhile; or no steady step yet)
  }
  for (const auto& [k, length] : p.recvs) {
    if (k >= b->pairs->size() || length > kGuessBytesMax || !b->book->sends_out(k) ||
        std::find(dirty.begin(), dirty.end(), k) == dirty.end()) {
      return;
    }
  }
  expire_guesses(core);
  const uint64_t next = (b->tag + p.step) & p.tag_mask;
  const uint64_t nslot = (p.slot & ~(p.tag_mask << p.tag_shift)) | (next << p.tag_shift);
  const auto mine = reinterpret_cast<PyObject*>(core);
  for (const auto& [k, length] : p.recvs) {
    PairObject* po = (*b->pairs)[k];
    const bool free = po != nullptr && po->fd >= 0 && po->last_tag != nullptr &&
                      (po->starts == nullptr || po->starts == mine) && po->pair->guesses() < kGuessesKept &&
                      std::none_of(po->routes->begin(), po->routes->end(), [&](const Route& r) { return r.slot == nslot; }) &&
                      std::none_of(core->pending->begin(), core->pending->end(),
                                   [&](const Pending& q) { return q.pair == po && q.slot == nslot; }) &&
                      !handed(po, nslot);
    if (!free) return;  // every pair or none: a book takes the slot's frames on all its pairs
  }
  for (size_t i = 0; i < p.recvs.size(); ++i) {
    const auto& [k, length] = p.recvs[i];
    PairObject* po = (*b->pairs)[k];
    const bool first_here = std::none_of(p.recvs.begin(), p.recvs.begin() + static_cast<std::ptrdiff_t>(i),
                                         [&](const auto& r) { return r.first == k; });
    if (first_here) {
      Py_INCREF(reinterpret_cast<PyObject*>(po));
      core->pending->push_back(Pending{po, nslot, {}, {}, true, true, next});
      po->starts = mine;  // its frames ask this core, which holds what comes before the book
    }
    po->pair->post_guess(nslot, length);
  }
  p.guessed = static_cast<int64_t>(next);
}

// Instance `slot` of `st` connected, posting `first`: those are what its next guess posts,
// and the slot's guesses left with nothing held are its own now.
void claim_guesses(CoreObject* core, const Starter& st, uint64_t slot, std::vector<std::pair<size_t, uint64_t>>&& first,
                   const std::vector<PairObject*>& pairs) {
  if (st.plan < core->plans->size() && !first.empty()) (*core->plans)[st.plan].recvs = std::move(first);
  auto& pend = *core->pending;
  for (auto it = pend.begin(); it != pend.end();) {
    const bool mine = it->guess && it->slot == slot && it->events.empty() && it->data.empty() &&
                      std::find(pairs.begin(), pairs.end(), it->pair) != pairs.end();
    if (!mine) {
      ++it;
      continue;
    }
    Py_DECREF(reinterpret_cast<PyObject*>(it->pair));
    it = pend.erase(it);
  }
}

// Starts the book of `slot` from `match` and feeds it `events` (its first frames, in order;
// none where the call's note starts it). False: a Python error is set.
bool start_book(CoreObject* core, const Starter& match, uint64_t slot, std::vector<gloo::Event>& events, double now,
                bool ahead) {
  const HeldStarter held(match);
  const Starter& st = held.get();
  Py_INCREF(reinterpret_cast<PyObject*>(core));  // the same for the core: Python may drop its last other reference
  struct CoreRef {
    PyObject* o;
    ~CoreRef() { Py_DECREF(o); }
  } core_ref{reinterpret_cast<PyObject*>(core)};
  {
    const auto tag = (slot >> st.tag_shift) & st.tag_mask;
    std::shared_ptr<ReleaseClock> clock;
    if (st.timeline != nullptr) {  // the template's timeline, for emulated ranks that enter now (and the what-if's delay)
      // Drawn: the instance's own entry, its draws seeded by its tag, as a Python start makes it.
      PyObject* tl = st.drawn ? PyObject_CallMethod(st.timeline, "at", "dKd", now + st.entry_delay,
                                                    static_cast<unsigned long long>(tag), unadopted_end(core))
                              : PyObject_CallMethod(st.timeline, "at", "d", now + st.entry_delay);
      if (tl == nullptr) return false;
      // None from a drawn start: the timing went inactive since the offer (the zero model,
      // its what-if cleared), so no clock, as a Python start would make it; Python drops the
      // starter at its next turn (Engine.adopt_started).
      if (!(st.drawn && tl == Py_None)) {
        const timing::TimingApi* api = timing_api();
        int kind = 0;
        void* native = api != nullptr ? api->native_of(tl, &kind) : nullptr;
        if (native == nullptr) {
          Py_DECREF(tl);
          PyErr_SetString(PyExc_TypeError, "a starter's timeline made a timeline that is not native");
          return false;
        }
        try {
          clock = std::make_shared<NativeClock>(tl, api, native, kind);
        } catch (const std::bad_alloc&) {
          Py_DECREF(tl);
          PyErr_NoMemory();
          return false;
        }
      }
      Py_DECREF(tl);  // the clock holds it
    }
    auto* b = reinterpret_cast<BookObject*>(BookType.tp_alloc(&BookType, 0));
    if (b == nullptr) return false;
    PyObject* obj = reinterpret_cast<PyObject*>(b);
    try {
      b->book = new Book(st.head + std::to_string(tag) + st.tail, slot, std::move(clock));
      if (st.turnarounds) b->book->time_turnarounds();
      b->conns = new std::vector<PyObject*>();
      b->pairs = new std::vector<PairObject*>();
    } catch (const std::bad_alloc&) {
      Py_DECREF(obj);
      PyErr_NoMemory();
      return false;
    }
    Py_INCREF(reinterpret_cast<PyObject*>(core));
    b->core = core;
    ++core->in_flight;  // freed unfinished if its start fails below
    b->posted_ahead = ahead;
    b->on_note = events.empty();
    Py_INCREF(Py_None);
    b->owner = Py_None;  // until Python adopts it
    settle_plan(core, st, tag, slot, b);
    std::vector<std::pair<size_t, uint64_t>> first;  // the receives it posts as it connects
    std::vector<std::pair<uint64_t, uint64_t>> journal;
    bool ok = load_into(b, st.program);
    for (size_t k = 0; ok && k < st.conns.size(); ++k) {
      journal.clear();
      ok = connect_pair(b, k, st.conns[k], &journal);
      for (const auto& [s, length] : journal) {
        if (s == slot) first.emplace_back(k, length);
      }
    }
    if (ok) claim_guesses(core, st, slot, std::move(first), *b->pairs);
    if (ok) {
      try {
        Py_INCREF(st.token);
        core->started->emplace_back(st.token, obj);  // the reference tp_alloc gave
      } catch (const std::bad_alloc&) {
        Py_DECREF(st.token);
        PyErr_NoMemory();
        ok = false;
      }
    }
    if (!ok) {
      unroute(b);
      Py_DECREF(obj);
      return false;
    }
    for (gloo::Event& e : events) {
      Frame f{e.kind, e.slot, e.length, std::move(e.payload)};
      if (!feed(b, st.index, f, now)) return false;
    }
    return true;
  }
}

// Whether a book of `slot` runs on one of the starter's pairs already (another real rank's
// note, or its frames, started it).
int routed(const Starter& st, uint64_t slot) {
  return any_pair(st, [slot](PairObject* po) {
    return std::any_of(po->routes->begin(), po->routes->end(), [slot](const Route& r) { return r.slot == slot; });
  });
}

// The note of a call told its instance's shape and tag before any of its frames: the
// instance starts now, as the real rank's call enters, not when its first frame arrives.
// The emulated ranks' first notices (their receives, ready) then reach the real rank about
// when it writes its own, as a real peer's do that enters with it, and its first sends go
// at once, as between real ranks, rather than a round trip through the controller later.
// 1: started; 0: the note's tag is not the one after the rank's latest collective's
// (names_its_call), no starter of this note, or the instance runs already or is Python's
// (its frames came first); -1: a Python error is set.
int start_on_note(CoreObject* core, int64_t note, uint64_t tag, double now, const std::string& group, int rank) {
  if (!names_its_call(core, group, rank, tag)) return 0;  // the note's tag may be past its call's
  for (const Starter& st : *core->starters) {
    if (st.note != note || st.note < 0) continue;
    const uint64_t slot = st.value | ((tag & st.tag_mask) << st.tag_shift);
    const int running = routed(st, slot);
    if (running != 0) return running < 0 ? -1 : 0;
    const int python = python_has(st, slot);
    if (python != 0) return python < 0 ? -1 : 0;
    bool held = false, guessed = false;
    for (const Pending& p : *core->pending) {
      if (p.slot != slot) continue;
      const bool empty = p.guess && p.events.empty() && p.data.empty();
      guessed = guessed || empty;
      held = held || !empty;
    }
    if (held) return 0;  // its first frames wait for a starter of several: they start it
    std::vector<gloo::Event> none;  // a guess posted its first receives: its book takes them (claim_guesses)
    return start_book(core, st, slot, none, now, guessed) ? 1 : -1;
  }
  return 0;
}

// A frame of a slot no book takes, on a pair whose core has starters: 1 if it was taken
// (a book started from it and the frames held before it; held as a prefix of a starter's
// first frames; or handed back in `rest` after the frames held before it, which then are
// no starter's), 0 if not (the caller hands it on), -1 with a Python error set.
int start_natively(PairObject* po, gloo::Event& ev, double now, std::vector<gloo::Event>* rest) {
  auto* core = reinterpret_cast<CoreObject*>(po->starts);
  std::vector<Pending>& pend = *core->pending;
  auto held = std::find_if(pend.begin(), pend.end(), [&](const Pending& p) { return p.pair == po && p.slot == ev.slot; });
  if (ev.kind == gloo::EventKind::kData && held != pend.end() && held->ahead) {
    held->data.push_back(std::move(ev));  // a payload our post ahead let come: it waits with the notices
    return 1;
  }
  const size_t n = (held != pend.end() ? held->events.size() : 0) + 1;
  auto frame = [&](size_t i) -> const gloo::Event& { return i + 1 < n ? held->events[i] : ev; };
  const Starter* exact = nullptr;
  bool prefix = false, ahead = false;
  auto arm_of = [&](const Starter& st) {  // the arm that lets `st` start this slot (end(): none)
    const uint64_t tag = (ev.slot >> st.tag_shift) & st.tag_mask;
    return std::find(core->arms->begin(), core->arms->end(), std::make_pair(st.arm, tag));
  };
  if (ev.kind != gloo::EventKind::kData) {
    for (const Starter& st : *core->starters) {
      if (st.pair != po || (ev.slot & st.mask) != st.value || st.frames.size() < n) continue;
      bool same = true;
      for (size_t i = 0; same && i < n; ++i) {
        same = st.frames[i].first == frame(i).kind && st.frames[i].second == frame(i).length;
      }
      if (!same) continue;
      if (st.arm >= 0 && arm_of(st) == core->arms->end()) continue;  // no note told this instance that shape
      const int python = python_has(st, ev.slot);
      if (python < 0) return -1;
      if (python > 0) continue;  // Python owns the instance: its frames all go there
      if (st.frames.size() == n) {
        exact = &st;
        break;
      }
      prefix = true;
      ahead = ahead || st.post_ahead;
    }
  }
  std::vector<gloo::Event> events, data;
  const bool was_ahead = held != pend.end() && held->ahead;
  if (held != pend.end() && (exact != nullptr || !prefix)) {  // the held frames go on: to a book, or back
    events = std::move(held->events);
    data = std::move(held->data);
    Py_DECREF(reinterpret_cast<PyObject*>(held->pair));
    pend.erase(held);
  }
  if (exact != nullptr) {
    if (exact->arm >= 0) core->arms->erase(arm_of(*exact));
    events.push_back(std::move(ev));
    std::move(data.begin(), data.end(), std::back_inserter(events));
    return start_book(core, *exact, events.front().slot, events, now, was_ahead) ? 1 : -1;  // it copies the starter before any Python can run
  }
  if (prefix) {
    if (held != pend.end()) {
      held->events.push_back(std::move(ev));
      return 1;
    }
    const uint64_t slot = ev.slot, length = ev.length;
    Py_INCREF(reinterpret_cast<PyObject*>(po));
    pend.push_back(Pending{po, slot, {}});
    pend.back().events.push_back(std::move(ev));
    if (ahead && po->fd >= 0) {  // the first frame (n == 1), a send notice (add_starter checks)
      pend.back().ahead = true;
      po->pair->post_ahead(slot, length);
      int err = 0;
      if (po->pair->outbox().flush(po->fd, &err) != FlushResult::kDone) want_write(core, po->fd);
    }
    return 1;
  }
  if (events.empty()) return 0;
  for (gloo::Event& e : events) hand_to_python(po, std::move(e), rest);
  hand_to_python(po, std::move(ev), rest);
  for (gloo::Event& e : data) hand_to_python(po, std::move(e), rest);
  return 1;
}



}  // namespace

void advance_tag(int64_t* last, uint64_t slot) {
  const uint64_t prefix = slot >> 56;
  if (prefix < 1 || prefix > 8) return;  // a point-to-point slot: the user's tag
  const auto tag = static_cast<int64_t>((slot >> 24) & 0xFFFFFFFFu);
  // Tags wrap at 32 bits: a tag is later if it is less than half the range ahead.
  if (*last < 0 || ((static_cast<uint64_t>(tag) - static_cast<uint64_t>(*last)) & 0xFFFFFFFFu) - 1 < 0x7FFFFFFFu) {
    *last = tag;
  }
}

bool route(PairObject* po, std::vector<gloo::Event>& events, double now, std::vector<gloo::Event>* rest) {
  for (gloo::Event& ev : events) {
    if (po->last_tag != nullptr) advance_tag(po->last_tag->get(), ev.slot);
    const Route* found = nullptr;
    for (const Route& r : *po->routes) {
      if (r.slot == ev.slot) {
        found = &r;
        break;
      }
    }
    if (found == nullptr) {
      const int started = po->starts != nullptr ? start_natively(po, ev, now, rest) : 0;
      if (started < 0) return false;
      if (started == 0) hand_to_python(po, std::move(ev), rest);
      continue;
    }
    // The route may go while the book runs (it completes): nothing below reads it after.
    auto* book = reinterpret_cast<BookObject*>(found->book);
    Frame f{ev.kind, ev.slot, ev.length, std::move(ev.payload)};
    if (!feed(book, found->index, f, now)) return false;
  }
  return true;
}

PyObject* dispatch(PairObject* po, std::vector<gloo::Event>& events, double now) {
  std::vector<gloo::Event> rest;
  if (!route(po, events, now, &rest)) return nullptr;
  return events_to_list(rest);
}

bool parse_msg(PyObject* m, int64_t* peer, int64_t* step, int64_t* nbytes) {
  if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 3) {
    PyErr_SetString(PyExc_TypeError, "expected a (peer, step, nbytes) message");
    return false;
  }
  *peer = PyLong_AsLongLong(PyTuple_GET_ITEM(m, 0));
  *step = PyLong_AsLongLong(PyTuple_GET_ITEM(m, 1));
  *nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(m, 2));
  if (PyErr_Occurred()) return false;
  if (*nbytes < 0) {
    PyErr_Format(PyExc_ValueError, "a message at step %lld of %lld bytes: only the wire tells its length; add it alone",
                 static_cast<long long>(*step), static_cast<long long>(*nbytes));
    return false;
  }
  return true;
}

bool set_core_sink(PyObject* core, CoreSink* sink) {
  if (!PyObject_TypeCheck(core, &CoreType)) {
    PyErr_SetString(PyExc_TypeError, "expected a Core");
    return false;
  }
  reinterpret_cast<CoreObject*>(core)->sink = sink;
  return true;
}

bool book_due_at(PyObject* obj, size_t pair, double now) {
  auto* b = reinterpret_cast<BookObject*>(obj);
  if (b->finished) return true;
  Py_INCREF(obj);  // its hooks may drop the last other reference
  const bool ok = run_book(b, [&](Actions& a) { b->book->due(pair, now, a); });
  Py_DECREF(obj);
  return ok;
}

bool add_type(PyObject* m, PyTypeObject* type, const TypeSpec& spec) {
  static std::vector<std::string>* names = new std::vector<std::string>();  // tp_name outlives the call
  names->push_back(std::string("neuronabox.controller._native.") + spec.name);
  type->tp_name = names->back().c_str();
  type->tp_basicsize = spec.size;
  type->tp_dealloc = spec.dealloc;
  type->tp_flags = Py_TPFLAGS_DEFAULT | (spec.traverse != nullptr ? Py_TPFLAGS_HAVE_GC : 0);
  type->tp_traverse = spec.traverse;
  type->tp_clear = spec.clear;
  type->tp_doc = spec.doc;
  type->tp_methods = spec.methods;
  type->tp_getset = spec.getset;
  type->tp_init = spec.init;
  type->tp_new = PyType_GenericNew;
  if (PyType_Ready(type) < 0) return false;
  Py_INCREF(type);
  if (PyModule_AddObject(m, spec.name, reinterpret_cast<PyObject*>(type)) < 0) {
    Py_DECREF(type);
    return false;
  }
  return true;
}

int add_book_types(PyObject* m) {
  const bool ok =
      add_type(m, &CoreType,
               {"Core", sizeof(CoreObject), core_dealloc,
                "The host of the collective books: their timers, and the hooks for what Python does.", core_init,
                core_methods, nullptr, core_traverse, core_clear}) &&
      add_type(m, &BookType,
               {"Book", sizeof(BookObject), book_dealloc,
                "One collective instance's boundary bookkeeping (matching, dependencies, FIFO, release).", book_init,
                book_methods, book_getset}) &&
      add_type(m, &ProgramType,
               {"Program", sizeof(ProgramObject), program_dealloc,
                "A boundary program recorded once per shape, loaded into each book of that shape.", program_init,
                program_methods, program_getset});
  return ok ? PyModule_AddFunctions(m, book_module_methods) : -1;
}

}  // namespace nbx::py
