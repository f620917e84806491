// The virtual-time driver's wire and clock: the simulated real rank (virtual_rank.h)
// against the engine's pairs and books, with no Python per frame.
//
// A live run's loop reads sockets and runs release timers on the monotonic clock; this
// one owns time. Its events are one queue, in time and then in order: the books' release
// timers and their writes
// (a Core hands them over, as a CoreSink), the simulated rank's frames, its wake-ups,
// and Python's own calls (`call_at`: the engine's grace timers, the observer's answers,
// the next collective's entry). Each frame crosses the same two native pair machines
// as a live one: the simulated rank's side (a mirror gloo::Pair) writes it, the
// engine's side (conn.pair) reads it and hands it to the book routed for its slot, and
// only frames no book takes yet (an instance whose shape is not known) reach Python.
//
// Entry posts the instance's first notice alone and the rest at the same instant, after
// whatever that notice set going (the engine asking the observer for the shape, which
// answers "later", in the loop): the rest then go to the installed book natively
// instead of waiting in Python for the shape.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "book.h"
#include "pyglue.h"
#include "virtual_rank.h"

namespace nbx::py {
namespace {

using sim::RankProgram;
using sim::SimulatedRank;


// -- RankProgram -----------------------------------------------------------------------
struct ProgramObject {
  PyObject_HEAD
  std::shared_ptr<const RankProgram>* program;
};

PyTypeObject RankProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool parse_msgs(PyObject* seq, std::vector<sim::Msg>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of (peer, step, nbytes) messages");
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->resize(static_cast<size_t>(n));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    sim::Msg& m = (*out)[static_cast<size_t>(i)];
    ok = parse_msg(PySequence_Fast_GET_ITEM(fast, i), &m.peer, &m.step, &m.nbytes);
  }
  Py_DECREF(fast);
  return ok;
}

int program_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"sends", "recvs", "lag", nullptr};
  PyObject *sends_obj, *recvs_obj;
  long long lag;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOL", const_cast<char**>(kw), &sends_obj, &recvs_obj, &lag)) {
    return -1;
  }
  std::vector<sim::Msg> sends, recvs;
  if (!parse_msgs(sends_obj, &sends) || !parse_msgs(recvs_obj, &recvs)) return -1;
  auto* self = reinterpret_cast<ProgramObject*>(obj);
  delete self->program;
  self->program = new (std::nothrow)
      std::shared_ptr<const RankProgram>(std::make_shared<RankProgram>(std::move(sends), std::move(recvs), lag));
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

PyObject* program_peers(PyObject* obj, void*) {
  auto* self = reinterpret_cast<ProgramObject*>(obj);
  if (self->program == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "RankProgram.__init__ was not called");
    return nullptr;
  }
  const auto& peers = (*self->program)->peers();
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(peers.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < peers.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(peers[i]));
  return t;
}

PyGetSetDef program_getset[] = {
    {"peers", program_peers, nullptr, "the peers it talks to, in the order start() takes their links", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// -- the wire --------------------------------------------------------------------------
struct Link {
  PyObject* conn;  // strong: the engine's side of the pair (its `pair` is `engine`)
  PairObject* engine;  // strong
  std::unique_ptr<gloo::Pair> mirror;  // the simulated rank's side
  int64_t group, peer;  // the pair's group and emulated peer (group rank)
};

struct Instance {
  Instance(std::shared_ptr<const RankProgram> p, double work) : rank(std::move(p), work) {}
  SimulatedRank rank;
  uint64_t id = 0;  // its key in `instances`, which wake-ups name it by (it may be gone by then)
  uint64_t slot = 0;
  int64_t group = 0;
  std::vector<size_t> links;  // per program peer
  PyObject* on_done = nullptr;  // strong: on_done(end)
  size_t posted = 0;  // notices posted at entry so far: its receives, then its sends
  double wake_at = std::numeric_limits<double>::infinity();  // earliest wake-up queued
};

enum class Due : uint8_t { kPython, kTimer, kRead, kEnter, kEnterRest, kWake };

struct Event {
  double at;
  uint64_t seq;
  Due what;
  PyObject* obj;  // strong: the callable (kPython) or the book (kTimer)
  uint64_t arg;   // the book's pair, the link, or the instance
  std::vector<uint8_t> bytes;  // kRead: the frames the engine wrote
};

struct Later {
  bool operator()(const Event& x, const Event& y) const { return x.at != y.at ? x.at > y.at : x.seq > y.seq; }
};

// The state, and the Core's sink.
class Wire final : public CoreSink {
 public:
  ~Wire() override { clear(); }

  double now = 0.0;
  PyObject* core = nullptr;    // strong
  PyObject* frames = nullptr;  // strong: frames(conn, events) for those no book takes
  std::vector<Event> heap;   // events after now, a min-heap on (at, seq)
  std::deque<Event> current;  // events at now, in order: most are (a write read at once)
  std::vector<Link> links;
  std::unordered_map<PairObject*, size_t> link_of;
  std::unordered_map<uint64_t, std::unique_ptr<Instance>> instances;
  std::map<std::pair<int64_t, uint64_t>, Instance*> by_slot;  // (group, slot) -> one of `instances`
  uint64_t next_id = 0;

  void push(double at, Due what, PyObject* obj, uint64_t arg, std::vector<uint8_t> bytes = {}) {
    if (at <= now) {
      current.push_back(Event{now, seq_++, what, obj, arg, std::move(bytes)});
      return;
    }
    heap.push_back(Event{at, seq_++, what, obj, arg, std::move(bytes)});
    std::push_heap(heap.begin(), heap.end(), Later());
  }

  void timer(double when, PyObject* book, size_t pair) override {
    Py_INCREF(book);
    push(when, Due::kTimer, book, pair);
  }

  bool emit(PyObject*, PairObject* po) override {
    auto it = link_of.find(po);
    if (it == link_of.end()) {
      PyErr_SetString(PyExc_RuntimeError, "the engine wrote on a pair the virtual wire has no link for");
      return false;
    }
    std::vector<uint8_t> raw = spare();
    po->pair->outbox().take_into(&raw);
    if (!raw.empty()) push(now, Due::kRead, nullptr, it->second, std::move(raw));
    return true;
  }

  // A byte buffer for a read, with the capacity of one used before.
  std::vector<uint8_t> spare() {
    if (spares_.empty()) return {};
    std::vector<uint8_t> b = std::move(spares_.back());
    spares_.pop_back();
    return b;
  }
  void give_back(std::vector<uint8_t> b) {
    if (spares_.size() < kSpares && b.capacity() <= kSpareBytes) spares_.push_back(std::move(b));
  }

  // Runs events due by `until`; false with a Python error set.
  bool run(double until);

  int traverse(visitproc visit, void* arg) {
    Py_VISIT(core);
    Py_VISIT(frames);
    for (const Link& l : links) {
      Py_VISIT(l.conn);
      Py_VISIT(reinterpret_cast<PyObject*>(l.engine));
    }
    for (const auto& [id, inst] : instances) Py_VISIT(inst->on_done);
    for (const Event& e : heap) Py_VISIT(e.obj);
    for (const Event& e : current) Py_VISIT(e.obj);
    return 0;
  }

  void clear() {
    if (core != nullptr) set_core_sink(core, nullptr);
    std::vector<Event> events = std::move(heap);
    heap.clear();
    for (Event& e : current) events.push_back(std::move(e));
    current.clear();
    std::vector<Link> held = std::move(links);
    links.clear();
    link_of.clear();
    auto insts = std::move(instances);
    instances.clear();
    by_slot.clear();
    for (Event& e : events) Py_XDECREF(e.obj);
    for (Link& l : held) {
      Py_XDECREF(l.conn);
      Py_XDECREF(reinterpret_cast<PyObject*>(l.engine));
    }
    for (auto& [id, inst] : insts) Py_XDECREF(inst->on_done);
    Py_CLEAR(frames);
    Py_CLEAR(core);
  }

  // The program's index of the peer on link `li`, or -1.
  int64_t peer_of(const Instance& inst, size_t li) const {
    if (inst.links.size() <= 8) {  // a ring's two, a tree's few: a scan beats hashing
      for (size_t p = 0; p < inst.links.size(); ++p) {
        if (inst.links[p] == li) return static_cast<int64_t>(p);
      }
      return -1;
    }
    const int64_t p = inst.rank.program().index_of(links[li].peer);
    return p >= 0 && inst.links[static_cast<size_t>(p)] == li ? p : -1;
  }

  bool enter(uint64_t id, bool rest);
  bool read(size_t link, const std::vector<uint8_t>& raw);
  bool read_events(size_t link, const std::vector<uint8_t>& raw, std::vector<gloo::Event>& events);
  bool wake(Instance& inst);

 private:
  bool say(size_t link);
  bool serve(Instance& inst, size_t peer);
  bool check_done(Instance& inst);
  bool post_notice(Instance& inst);

  uint64_t seq_ = 0;
  static constexpr size_t kSpares = 64, kSpareBytes = 1 << 20;
  std::vector<std::vector<uint8_t>> spares_;  // read buffers, for reuse
  std::vector<gloo::Event> events_;  // what they parse into
  std::vector<gloo::Event> read_events_;  // what the engine's frames parse into (read)
};

struct WireObject {
  PyObject_HEAD
  Wire* wire;
};

PyTypeObject WireType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The simulated rank's queued frames on `link` reach the engine's side: its books take
// theirs natively; the rest go to Python.
bool Wire::say(size_t li) {
  Link& l = links[li];
  if (l.mirror->outbox().empty()) return true;
  // The scratch vectors are borrowed for the call (and handed back with their capacity):
  // a hook below may say on another pair.
  std::vector<gloo::Event> events, rest;
  events.swap(events_);
  bool ok = true;
  try {
    gloo::Pair& engine = *l.engine->pair;
    l.mirror->outbox().drain([&](const uint8_t* p, size_t n) { engine.feed(p, n, events); });
  } catch (const gloo::WireError& e) {
    PyErr_SetString(g_wire_error, e.what());
    ok = false;
  }
  PyObject* conn = l.conn;
  Py_INCREF(conn);  // the hooks below may drop the link's reference
  ok = ok && route(l.engine, events, now, &rest);
  if (ok && !rest.empty()) {
    PyObject* list = events_to_list(rest);
    PyObject* r = list != nullptr ? PyObject_CallFunctionObjArgs(frames, conn, list, nullptr) : nullptr;
    ok = r != nullptr;
    Py_XDECREF(r);
    Py_XDECREF(list);
  }
  Py_DECREF(conn);
  events.clear();
  events_.swap(events);
  return ok;
}

// The next entry notice: the receives in step order, then the sends in program order.
bool Wire::post_notice(Instance& inst) {
  const RankProgram& p = inst.rank.program();
  const size_t nr = p.recvs().size();
  const bool recv = inst.posted < nr;
  const size_t i = recv ? inst.posted : inst.posted - nr;
  const sim::Msg& m = recv ? p.recvs()[i] : p.sends()[i];
  const size_t li = inst.links[recv ? p.peer_of_recv(i) : p.peer_of_send(i)];
  ++inst.posted;
  gloo::Pair& mirror = *links[li].mirror;
  try {
    if (recv) {
      mirror.recv_ready(inst.slot, static_cast<uint64_t>(m.nbytes));
    } else {
      mirror.send_ready(inst.slot, static_cast<uint64_t>(m.nbytes));
    }
  } catch (const gloo::WireError& e) {
    PyErr_SetString(g_wire_error, e.what());
    return false;
  }
  return say(li);
}

bool Wire::enter(uint64_t id, bool rest) {
  auto it = instances.find(id);
  if (it == instances.end()) return true;
  Instance& inst = *it->second;
  const RankProgram& p = inst.rank.program();
  const size_t notices = p.recvs().size() + p.sends().size();
  if (!rest) {
    inst.rank.enter(now);
    if (notices > 1) {
      if (!post_notice(inst)) return false;
      push(now, Due::kEnterRest, nullptr, id);
      return true;
    }
  }
  while (inst.posted < notices) {
    if (!post_notice(inst)) return false;
  }
  return wake(inst);
}

// Sends what `peer` has a receive posted for and the program allows by now; nothing
// before the entry's notices are all out (as a rank's, they go before any data).
bool Wire::serve(Instance& inst, size_t peer) {
  const RankProgram& p = inst.rank.program();
  if (inst.posted < p.recvs().size() + p.sends().size()) return true;
  for (;;) {
    size_t i = 0;
    double when = 0.0;
    switch (inst.rank.next_send(peer, now, &i, &when)) {
      case SimulatedRank::Next::kNone:
        return true;
      case SimulatedRank::Next::kLater:
        if (when < inst.wake_at) {
          inst.wake_at = when;
          push(when, Due::kWake, nullptr, inst.id);
        }
        return true;
      case SimulatedRank::Next::kSend:
        break;
    }
    const sim::Msg& m = inst.rank.program().sends()[i];
    const size_t li = inst.links[peer];
    try {
      links[li].mirror->data(inst.slot, zeros(static_cast<size_t>(m.nbytes)));
    } catch (const gloo::WireError& e) {
      PyErr_SetString(g_wire_error, e.what());
      return false;
    }
    if (!say(li)) return false;
  }
}

bool Wire::wake(Instance& inst) {
  const size_t peers = inst.rank.program().peers().size();
  for (size_t p = 0; p < peers; ++p) {
    if (inst.rank.has_unsent(p) && !serve(inst, p)) return false;
  }
  return check_done(inst);
}

// Everything received and sent: the instance is over for the real rank.
bool Wire::check_done(Instance& inst) {
  if (!inst.rank.finished()) return true;
  const double end = inst.rank.done();
  PyObject* on_done = inst.on_done;
  inst.on_done = nullptr;
  by_slot.erase({inst.group, inst.slot});
  instances.erase(inst.id);  // `inst` is gone from here
  if (on_done == nullptr) return true;
  PyObject* r = PyObject_CallFunction(on_done, "d", end);
  Py_DECREF(on_done);
  Py_XDECREF(r);
  return r != nullptr;
}

// The engine wrote on a pair: the simulated rank reads it.
bool Wire::read(size_t li, const std::vector<uint8_t>& raw) {
  std::vector<gloo::Event> events;
  events.swap(read_events_);  // borrowed, as say's scratch is
  events.clear();
  const bool ok = read_events(li, raw, events);
  read_events_.swap(events);
  return ok;
}

bool Wire::read_events(size_t li, const std::vector<uint8_t>& raw, std::vector<gloo::Event>& events) {
  const int64_t group = links[li].group;
  try {
    links[li].mirror->feed(raw.data(), raw.size(), events);
  } catch (const gloo::WireError& e) {
    PyErr_SetString(g_wire_error, e.what());
    return false;
  }
  for (const gloo::Event& ev : events) {
    if (ev.kind == gloo::EventKind::kSendReady) continue;  // its data follows
    auto key = by_slot.find({group, ev.slot});
    if (key == by_slot.end()) {
      PyErr_Format(PyExc_RuntimeError, "the engine wrote on slot %s of group %lld, which the simulated rank is not in",
                   gloo::slot_hex(ev.slot).c_str(), static_cast<long long>(group));
      return false;
    }
    Instance& inst = *key->second;
    const int64_t pi = peer_of(inst, li);
    if (pi < 0) {
      PyErr_Format(PyExc_RuntimeError, "a frame on slot %s from rank %lld, which its program does not talk to",
                   gloo::slot_hex(ev.slot).c_str(), static_cast<long long>(links[li].peer));
      return false;
    }
    const auto peer = static_cast<size_t>(pi);
    if (ev.kind == gloo::EventKind::kRecvReady) {
      inst.rank.credit(peer);
      if (!serve(inst, peer) || !check_done(inst)) return false;
    } else {
      if (!inst.rank.expects(peer)) {
        PyErr_Format(PyExc_RuntimeError, "data on slot %s the simulated rank has no receive left for",
                     gloo::slot_hex(ev.slot).c_str());
        return false;
      }
      inst.rank.got(peer, now);
      // A pairwise collective's sends wait for no receive: its data frees nothing, and
      // waking every peer would cost O(W) per message.
      if (!(inst.rank.program().sends_wait() ? wake(inst) : check_done(inst))) return false;
    }
  }
  return true;
}

bool Wire::run(double until) {
  for (;;) {
    // The earliest on (at, seq): what is at now goes first unless the heap holds an
    // older event at now too. Time moves on only once nothing is left at now.
    const bool from_heap =
        !heap.empty() && (current.empty() || heap.front().at < current.front().at ||
                          (heap.front().at == current.front().at && heap.front().seq < current.front().seq));
    if (from_heap ? heap.front().at > until : (current.empty() || current.front().at > until)) break;
    Event e;
    if (from_heap) {
      std::pop_heap(heap.begin(), heap.end(), Later());
      e = std::move(heap.back());
      heap.pop_back();
    } else {
      e = std::move(current.front());
      current.pop_front();
    }
    now = e.at;
    bool ok = true;
    switch (e.what) {
      case Due::kPython: {
        PyObject* r = PyObject_CallNoArgs(e.obj);
        ok = r != nullptr;
        Py_XDECREF(r);
        break;
      }
      case Due::kTimer:
        ok = book_due_at(e.obj, static_cast<size_t>(e.arg), now);
        break;
      case Due::kRead:
        ok = read(static_cast<size_t>(e.arg), e.bytes);
        give_back(std::move(e.bytes));
        break;
      case Due::kEnter:
      case Due::kEnterRest:
        ok = enter(e.arg, e.what == Due::kEnterRest);
        break;
      case Due::kWake: {
        auto it = instances.find(e.arg);
        if (it != instances.end()) {
          if (it->second->wake_at == e.at) it->second->wake_at = std::numeric_limits<double>::infinity();
          ok = wake(*it->second);
        }
        break;
      }
    }
    Py_XDECREF(e.obj);
    if (!ok) return false;
  }
  return true;
}

// -- the Python type -------------------------------------------------------------------
Wire* wire_of(PyObject* obj) {
  Wire* w = reinterpret_cast<WireObject*>(obj)->wire;
  if (w == nullptr || w->core == nullptr) PyErr_SetString(PyExc_RuntimeError, "VirtualWire.__init__ was not called");
  return w != nullptr && w->core != nullptr ? w : nullptr;
}

int wire_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"core", "frames", nullptr};
  PyObject *core, *frames;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO", const_cast<char**>(kw), &core, &frames)) return -1;
  auto* self = reinterpret_cast<WireObject*>(obj);
  if (self->wire != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a VirtualWire is initialized once");
    return -1;
  }
  self->wire = new (std::nothrow) Wire();
  if (self->wire == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  if (!set_core_sink(core, self->wire)) return -1;
  Py_INCREF(core);
  Py_INCREF(frames);
  self->wire->core = core;
  self->wire->frames = frames;
  return 0;
}

int wire_traverse(PyObject* obj, visitproc visit, void* arg) {
  Wire* w = reinterpret_cast<WireObject*>(obj)->wire;
  return w != nullptr ? w->traverse(visit, arg) : 0;
}

int wire_clear(PyObject* obj) {
  Wire* w = reinterpret_cast<WireObject*>(obj)->wire;
  if (w != nullptr) w->clear();
  return 0;
}

void wire_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  auto* self = reinterpret_cast<WireObject*>(obj);
  delete self->wire;  // clears first
  self->wire = nullptr;
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* wire_call_at(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  Wire* w = wire_of(obj);
  if (w == nullptr) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "call_at(when, fn)");
    return nullptr;
  }
  const double when = PyFloat_AsDouble(args[0]);
  if (when == -1.0 && PyErr_Occurred()) return nullptr;
  Py_INCREF(args[1]);
  w->push(when, Due::kPython, args[1], 0);
  Py_RETURN_NONE;
}

PyObject* wire_emit(PyObject* obj, PyObject* conn) {
  Wire* w = wire_of(obj);
  if (w == nullptr) return nullptr;
  PyObject* pair = PyObject_GetAttrString(conn, "pair");
  if (pair == nullptr) return nullptr;
  const bool native = PyObject_TypeCheck(pair, &PairType);
  const bool ok = native && w->emit(conn, reinterpret_cast<PairObject*>(pair));
  Py_DECREF(pair);
  if (!native) PyErr_SetString(PyExc_TypeError, "a connection must carry a native pair (conn.pair)");
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyObject* wire_link(PyObject* obj, PyObject* args) {
  Wire* w = wire_of(obj);
  long long group, peer;
  PyObject* conn;
  if (w == nullptr || !PyArg_ParseTuple(args, "LLO", &group, &peer, &conn)) return nullptr;
  PyObject* pair = PyObject_GetAttrString(conn, "pair");
  if (pair == nullptr) return nullptr;
  if (!PyObject_TypeCheck(pair, &PairType)) {
    Py_DECREF(pair);
    PyErr_SetString(PyExc_TypeError, "a connection must carry a native pair (conn.pair)");
    return nullptr;
  }
  auto* po = reinterpret_cast<PairObject*>(pair);
  if (w->link_of.count(po) != 0) {
    Py_DECREF(pair);
    PyErr_SetString(PyExc_ValueError, "the connection is linked already");
    return nullptr;
  }
  std::unique_ptr<gloo::Pair> mirror(new (std::nothrow) gloo::Pair(gloo::kNoPayloadBound));
  if (!mirror) {
    Py_DECREF(pair);
    return PyErr_NoMemory();
  }
  mirror->discard_payloads();  // the simulated rank reads no bytes, only that they came
  Py_INCREF(conn);
  w->links.push_back(Link{conn, po, std::move(mirror), group, peer});  // keeps GetAttr's reference to the pair
  w->link_of[po] = w->links.size() - 1;
  return PyLong_FromSize_t(w->links.size() - 1);
}

PyObject* wire_start(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"program", "group", "slot", "at", "work", "links", "on_done", nullptr};
  Wire* w = wire_of(obj);
  PyObject *program, *links_obj, *on_done;
  long long group;
  unsigned long long slot;
  double at, work;
  if (w == nullptr || !PyArg_ParseTupleAndKeywords(args, kwargs, "O!LKddOO", const_cast<char**>(kw), &RankProgramType,
                                                   &program, &group, &slot, &at, &work, &links_obj, &on_done)) {
    return nullptr;
  }
  auto* po = reinterpret_cast<ProgramObject*>(program);
  if (po->program == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "RankProgram.__init__ was not called");
    return nullptr;
  }
  if (w->by_slot.count({group, slot}) != 0) {
    PyErr_Format(PyExc_ValueError, "slot %s of group %lld is in flight already", gloo::slot_hex(slot).c_str(), group);
    return nullptr;
  }
  std::vector<size_t> links;
  PyObject* fast = PySequence_Fast(links_obj, "links: a sequence of link ids");
  if (fast == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    const Py_ssize_t li = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
    if (li < 0 || static_cast<size_t>(li) >= w->links.size() || w->links[static_cast<size_t>(li)].group != group) {
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "no link %zd in group %lld", li, group);
      return nullptr;
    }
    links.push_back(static_cast<size_t>(li));
  }
  Py_DECREF(fast);
  if (links.size() != (*po->program)->peers().size()) {
    PyErr_Format(PyExc_ValueError, "%zu links for a program with %zu peers", links.size(),
                 (*po->program)->peers().size());
    return nullptr;
  }
  const auto& peers = (*po->program)->peers();
  for (size_t i = 0; i < links.size() && i < peers.size(); ++i) {
    if (w->links[links[i]].peer != peers[i]) {
      PyErr_Format(PyExc_ValueError, "link %zu is to rank %lld, not the program's peer %lld", links[i],
                   static_cast<long long>(w->links[links[i]].peer), static_cast<long long>(peers[i]));
      return nullptr;
    }
  }
  auto inst = std::make_unique<Instance>(*po->program, work);
  inst->slot = slot;
  inst->group = group;
  inst->links = std::move(links);
  if (on_done != Py_None) {
    Py_INCREF(on_done);
    inst->on_done = on_done;
  }
  const uint64_t id = inst->id = w->next_id++;
  w->by_slot[{group, slot}] = inst.get();
  w->instances[id] = std::move(inst);
  w->push(at, Due::kEnter, nullptr, id);
  Py_RETURN_NONE;
}

PyObject* wire_run(PyObject* obj, PyObject* args) {
  Wire* w = wire_of(obj);
  double until = std::numeric_limits<double>::infinity();
  if (w == nullptr || !PyArg_ParseTuple(args, "|d", &until)) return nullptr;
  Py_INCREF(obj);  // a callback may drop the last other reference
  const bool ok = w->run(until);
  Py_DECREF(obj);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyObject* wire_now(PyObject* obj, void*) {
  Wire* w = wire_of(obj);
  return w != nullptr ? PyFloat_FromDouble(w->now) : nullptr;
}

PyObject* wire_in_flight(PyObject* obj, void*) {
  Wire* w = wire_of(obj);
  return w != nullptr ? PyLong_FromSize_t(w->instances.size()) : nullptr;
}

PyMethodDef wire_methods[] = {
    {"call_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(wire_call_at)), METH_FASTCALL,
     "call_at(when, fn): call fn() at virtual time `when` (not before now)."},
    {"emit", wire_emit, METH_O, "emit(conn): the engine queued frames on conn.pair: the simulated rank reads them now."},
    {"link", wire_link, METH_VARARGS,
     "link(group, peer, conn) -> int: the engine's side of the pair with emulated `peer` (conn.pair), and the "
     "simulated rank's side to match."},
    {"start", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(wire_start)), METH_VARARGS | METH_KEYWORDS,
     "start(program, group, slot, at, work, links, on_done): the simulated rank enters an instance at `at`, each peer "
     "of the program on its link; on_done(end) when it is over for the rank."},
    {"run", wire_run, METH_VARARGS, "run(until=inf): advance virtual time from event to event."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef wire_getset[] = {
    {"now", wire_now, nullptr, "virtual time (seconds)", nullptr},
    {"in_flight", wire_in_flight, nullptr, "instances the simulated rank has not finished", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

int add_virtual_types(PyObject* m) {
  const bool ok =
      add_type(m, &RankProgramType,
               {"RankProgram", sizeof(ProgramObject), program_dealloc,
                "RankProgram(sends, recvs, lag): one simulated rank's side of a schedule, built once per shape.",
                program_init, nullptr, program_getset}) &&
      add_type(m, &WireType,
               {"VirtualWire", sizeof(WireObject), wire_dealloc,
                "VirtualWire(core, frames): the virtual-time driver's clock and wire, native per frame.", wire_init,
                wire_methods, wire_getset, wire_traverse, wire_clear});
  return ok ? PyModule_AddIntConstant(m, "NO_WAIT", RankProgram::kNoWait) : -1;
}

}  // namespace nbx::py
