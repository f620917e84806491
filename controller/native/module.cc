// Python bindings of the native data plane: `GlooPair` (the pair machine with its
// socket reads and writes) and `Payload` (received bytes, forwarded without a copy).
//
// The event types and the error class are the dialect's own Python classes, handed in
// once by `bind()`, so that the native and Python sides share one vocabulary.
#include <sys/socket.h>
#include <time.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "gloo_pair.h"
#include "pyglue.h"

namespace nbx::py {

PyObject* g_wire_error = nullptr;
PyTypeObject* g_recv_ready = nullptr;
PyTypeObject* g_send_ready = nullptr;
PyTypeObject* g_data = nullptr;
PyTypeObject PairType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace nbx::py

namespace {

using nbx::py::g_wire_error;
using nbx::py::PairObject;
using nbx::py::PairType;
using nbx::Bytes;
using nbx::BytesRef;
using nbx::gloo::Event;
using nbx::gloo::EventKind;
using nbx::gloo::Pair;
using nbx::gloo::WireError;

constexpr size_t kReadBudget = 8u << 20;  // bytes one read() takes before the loop serves others

using nbx::py::g_data;
using nbx::py::g_recv_ready;
using nbx::py::g_send_ready;

// -- Payload -------------------------------------------------------------------------
struct PayloadObject {
  PyObject_HEAD
  BytesRef ref;
};

PyTypeObject PayloadType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

PyObject* nbx::py::payload_wrap(BytesRef ref) {
  auto* self = PyObject_New(PayloadObject, &PayloadType);
  if (self == nullptr) return nullptr;
  new (&self->ref) BytesRef(std::move(ref));
  return reinterpret_cast<PyObject*>(self);
}

namespace {

void payload_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<PayloadObject*>(obj);
  self->ref.~BytesRef();
  PyObject_Free(obj);
}

int payload_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  auto* self = reinterpret_cast<PayloadObject*>(obj);
  return PyBuffer_FillInfo(view, obj, const_cast<uint8_t*>(self->ref->data()),
                           static_cast<Py_ssize_t>(self->ref->size()), 1, flags);
}

Py_ssize_t payload_len(PyObject* obj) { return static_cast<Py_ssize_t>(reinterpret_cast<PayloadObject*>(obj)->ref->size()); }

PyObject* payload_richcompare(PyObject* a, PyObject* b, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  Py_buffer x, y;
  if (PyObject_GetBuffer(a, &x, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (PyObject_GetBuffer(b, &y, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    PyBuffer_Release(&x);
    Py_RETURN_NOTIMPLEMENTED;
  }
  const bool same = x.len == y.len && std::memcmp(x.buf, y.buf, static_cast<size_t>(x.len)) == 0;
  PyBuffer_Release(&x);
  PyBuffer_Release(&y);
  return PyBool_FromLong((op == Py_EQ) == same);
}

PyObject* payload_repr(PyObject* obj) {
  return PyUnicode_FromFormat("<Payload of %zd bytes>", payload_len(obj));
}

PyBufferProcs payload_as_buffer = {payload_getbuffer, nullptr};
PySequenceMethods payload_as_sequence = {payload_len};

// A buffer Python handed in (zeros, a mirrored block), kept alive while queued.
class PyBufferBytes final : public Bytes {
 public:
  explicit PyBufferBytes(Py_buffer view) : view_(view) {}
  ~PyBufferBytes() override { PyBuffer_Release(&view_); }  // callers hold the GIL
  const uint8_t* data() const override { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const override { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_;
};

}  // namespace

bool nbx::py::as_bytes_ref(PyObject* obj, BytesRef* out) {
  if (Py_TYPE(obj) == &PayloadType) {
    *out = reinterpret_cast<PayloadObject*>(obj)->ref;
    return true;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) != 0) return false;
  *out = std::make_shared<PyBufferBytes>(view);
  return true;
}

namespace {

using nbx::py::as_bytes_ref;
using nbx::py::payload_wrap;

// -- GlooPair ------------------------------------------------------------------------
double monotonic_now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // Python's time.monotonic()
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int pair_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"max_payload", nullptr};
  unsigned long long max_payload = nbx::gloo::kNoPayloadBound;  // the posted receive is the real bound
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|K", const_cast<char**>(kw), &max_payload)) return -1;
  auto* self = reinterpret_cast<PairObject*>(obj);
  delete self->pair;
  self->fd = -1;
  self->handed_n = 0;
  if (self->routes == nullptr) self->routes = new (std::nothrow) std::vector<nbx::py::Route>();
  self->pair = new (std::nothrow) Pair(max_payload);
  if (self->pair == nullptr || self->routes == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

void pair_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  delete self->pair;
  delete self->routes;  // empty: a book holds its pairs while it routes them
  delete self->last_tag;
  Py_TYPE(obj)->tp_free(obj);
}

bool ready(PairObject* self) {
  if (g_wire_error == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuronabox.controller._native.bind() was not called");
    return false;
  }
  if (self->pair == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "GlooPair.__init__ was not called");
    return false;
  }
  return true;
}

// A tuple subclass (the dialect's NamedTuple) filled without calling its __new__.
PyObject* make_event(PyTypeObject* cls, PyObject* a, PyObject* b) {
  if (a == nullptr || b == nullptr) {
    Py_XDECREF(a);
    Py_XDECREF(b);
    return nullptr;
  }
  PyObject* ev = cls->tp_alloc(cls, 2);
  if (ev == nullptr) {
    Py_DECREF(a);
    Py_DECREF(b);
    return nullptr;
  }
  PyTuple_SET_ITEM(ev, 0, a);
  PyTuple_SET_ITEM(ev, 1, b);
  return ev;
}

}  // namespace

PyObject* nbx::py::events_to_list(std::vector<Event>& events) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(events.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    Event& e = events[i];
    PyObject* slot = PyLong_FromUnsignedLongLong(e.slot);
    PyObject* ev;
    switch (e.kind) {
      case EventKind::kRecvReady:
        ev = make_event(g_recv_ready, slot, PyLong_FromUnsignedLongLong(e.length));
        break;
      case EventKind::kSendReady:
        ev = make_event(g_send_ready, slot, PyLong_FromUnsignedLongLong(e.length));
        break;
      default:
        ev = make_event(g_data, slot, payload_wrap(std::move(e.payload)));
    }
    if (ev == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), ev);
  }
  return list;
}

namespace {

// Runs `body`, turning the core's exceptions into Python ones.
template <typename F>
PyObject* guarded(F&& body) {
  try {
    return body();
  } catch (const WireError& e) {
    PyErr_SetString(g_wire_error, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(g_wire_error, "out of memory for a frame's payload");
  }
  return nullptr;
}

PyObject* pair_receive(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "expected (data[, now])");
    return nullptr;
  }
  const double now = nargs == 2 ? PyFloat_AsDouble(args[1]) : monotonic_now();
  if (PyErr_Occurred()) return nullptr;
  Py_buffer view;
  if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) return nullptr;
  PyObject* result = guarded([&] {
    std::vector<Event> events;
    self->pair->feed(static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len), events);
    return nbx::py::dispatch(self, events, now);
  });
  PyBuffer_Release(&view);
  return result;
}

}  // namespace

PyObject* nbx::py::read_pair(PairObject* self, int fd, double now) {
  return guarded([&]() -> PyObject* {
    std::vector<Event> events;
    size_t total = 0;
    bool closed = false;
    for (;;) {
      Pair::Window w = self->pair->window();
      const ssize_t n = ::recv(fd, w.data, w.size, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == ECONNRESET || errno == EPIPE) {
          closed = true;
          break;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
      }
      if (n == 0) {
        closed = true;
        break;
      }
      self->pair->commit(static_cast<size_t>(n), events);
      total += static_cast<size_t>(n);
      if (static_cast<size_t>(n) < w.size || total >= kReadBudget) break;
    }
    if (closed && events.empty()) Py_RETURN_NONE;  // else the close shows on the next read
    return nbx::py::dispatch(self, events, now);
  });
}

namespace {

PyObject* pair_read(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  const int fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred()) return nullptr;
  return nbx::py::read_pair(self, fd, monotonic_now());
}

PyObject* pair_flush(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  const int fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred()) return nullptr;
  int err = 0;
  switch (self->pair->outbox().flush(fd, &err)) {
    case nbx::FlushResult::kDone:
      Py_RETURN_TRUE;
    case nbx::FlushResult::kPartial:
      Py_RETURN_FALSE;
    default:
      errno = err;
      return PyErr_SetFromErrno(PyExc_OSError);
  }
}

PyObject* pair_take(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  std::vector<uint8_t> out = self->pair->outbox().take();
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(out.data()), static_cast<Py_ssize_t>(out.size()));
}

PyObject* pair_raw(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return nullptr;
  self->pair->outbox().append(static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

template <void (Pair::*Notice)(uint64_t, uint64_t)>
PyObject* pair_notice(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "expected (slot, length)");
    return nullptr;
  }
  const unsigned long long slot = PyLong_AsUnsignedLongLong(args[0]);
  const unsigned long long length = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) return nullptr;
  (self->pair->*Notice)(slot, length);
  Py_RETURN_NONE;
}

template <void (Pair::*Frame)(uint64_t, BytesRef)>
PyObject* pair_payload(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "expected (slot, payload)");
    return nullptr;
  }
  const unsigned long long slot = PyLong_AsUnsignedLongLong(args[0]);
  if (PyErr_Occurred()) return nullptr;
  BytesRef ref;
  if (!as_bytes_ref(args[1], &ref)) return nullptr;
  return guarded([&] {
    (self->pair->*Frame)(slot, std::move(ref));
    Py_RETURN_NONE;
  });
}

PyObject* pair_forget_guess(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  const unsigned long long slot = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(self->pair->forget_guess(slot));
}

PyObject* pair_guesses(PyObject* obj, void*) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  return PyLong_FromSize_t(self->pair->guesses());
}

PyObject* pair_pending(PyObject* obj, void*) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  return PyLong_FromSize_t(self->pair->outbox().pending());
}

PyMethodDef pair_methods[] = {
    {"receive", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_receive)), METH_FASTCALL,
     "receive(data[, now]) -> [event]: bytes in, events out (those no routed book takes)."},
    {"read", pair_read, METH_O,
     "read(fd) -> [event] | None: receive from a non-blocking socket (events no routed book takes); None once it "
     "closed."},
    {"flush", pair_flush, METH_O, "flush(fd) -> bool: write the queued frames; False while some wait for the socket."},
    {"take", pair_take, METH_NOARGS, "take() -> bytes: the queued frames, removed."},
    {"raw", pair_raw, METH_O, "raw(data): queue bytes that are not a frame (a dialer's sequence number)."},
    {"send_ready", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_notice<&Pair::send_ready>)),
     METH_FASTCALL, "send_ready(slot, length): queue NOTIFY_SEND_READY."},
    {"recv_ready", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_notice<&Pair::recv_ready>)),
     METH_FASTCALL, "recv_ready(slot, length): post a receive and queue NOTIFY_RECV_READY."},
    {"post_guess", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_notice<&Pair::post_guess>)),
     METH_FASTCALL,
     "post_guess(slot, length): post a receive for an instance not begun and queue its NOTIFY_RECV_READY; any "
     "length of data takes it, and the slot's next recv_ready sends nothing."},
    {"forget_guess", pair_forget_guess, METH_O,
     "forget_guess(slot) -> bool: drop an unclaimed guess of the slot and its posted receive."},
    {"data", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_payload<&Pair::data>)), METH_FASTCALL,
     "data(slot, payload): queue a data frame; refuses what the real side would reject."},
    {"send", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pair_payload<&Pair::send>)), METH_FASTCALL,
     "send(slot, payload): NOTIFY_SEND_READY and the data frame, as Gloo sends them."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* pair_buffered(PyObject* obj, void*) {
  auto* self = reinterpret_cast<PairObject*>(obj);
  if (!ready(self)) return nullptr;
  return PyLong_FromSize_t(self->pair->buffered());
}

PyObject* pair_get_fd(PyObject* obj, void*) { return PyLong_FromLong(reinterpret_cast<PairObject*>(obj)->fd); }

int pair_set_fd(PyObject* obj, PyObject* value, void*) {
  const long fd = value == nullptr ? -1 : PyLong_AsLong(value);
  if (fd == -1 && PyErr_Occurred()) return -1;
  reinterpret_cast<PairObject*>(obj)->fd = static_cast<int>(fd);
  return 0;
}

PyGetSetDef pair_getset[] = {
    {"fd", pair_get_fd, pair_set_fd, "the pair's socket, written natively when a book sends on it (-1: none)",
     nullptr},
    {"pending", pair_pending, nullptr, "bytes queued, not yet written", nullptr},
    {"buffered", pair_buffered, nullptr, "bytes held for incomplete incoming frames", nullptr},
    {"guesses", pair_guesses, nullptr, "receives posted on a guess that no recv_ready has claimed", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// -- the kernel's floor ---------------------------------------------------------------
// A TCP ping-pong in compiled code on a blocking socket: what one message costs when
// nothing but the kernel stands between the two sides (the benchmarks' reference).
PyObject* pingpong(PyObject*, PyObject* args) {
  int fd, rounds, first;
  Py_ssize_t size;
  if (!PyArg_ParseTuple(args, "iinp", &fd, &rounds, &size, &first)) return nullptr;
  std::vector<uint8_t> buf(static_cast<size_t>(size > 0 ? size : 1));
  int err = 0;
  Py_BEGIN_ALLOW_THREADS
  for (int i = 0; i < rounds && err == 0; ++i) {
    for (int turn = 0; turn < 2 && err == 0; ++turn) {
      const bool sending = (turn == 0) == static_cast<bool>(first);
      size_t done = 0;
      while (done < static_cast<size_t>(size)) {
        const ssize_t n = sending ? ::send(fd, buf.data() + done, size - done, MSG_NOSIGNAL)
                                  : ::recv(fd, buf.data() + done, size - done, 0);
        if (n > 0) {
          done += static_cast<size_t>(n);
        } else if (n == 0 || errno != EINTR) {
          err = n == 0 ? ECONNRESET : errno;
          break;
        }
      }
    }
  }
  Py_END_ALLOW_THREADS
  if (err != 0) {
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  Py_RETURN_NONE;
}

// -- module --------------------------------------------------------------------------
PyObject* bind(PyObject*, PyObject* args) {
  PyObject *err, *rr, *sr, *data;
  if (!PyArg_ParseTuple(args, "OO!O!O!", &err, &PyType_Type, &rr, &PyType_Type, &sr, &PyType_Type, &data)) {
    return nullptr;
  }
  for (PyObject* cls : {rr, sr, data}) {
    if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls), &PyTuple_Type)) {
      PyErr_SetString(PyExc_TypeError, "event types must be tuple subclasses (NamedTuple)");
      return nullptr;
    }
  }
  Py_INCREF(err);
  Py_INCREF(rr);
  Py_INCREF(sr);
  Py_INCREF(data);
  g_wire_error = err;
  g_recv_ready = reinterpret_cast<PyTypeObject*>(rr);
  g_send_ready = reinterpret_cast<PyTypeObject*>(sr);
  g_data = reinterpret_cast<PyTypeObject*>(data);
  Py_RETURN_NONE;
}

PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "bind(WireError, RecvReady, SendReady, Data): the dialect's Python types."},
    {"pingpong", pingpong, METH_VARARGS,
     "pingpong(fd, rounds, size, first): `rounds` exchanges of `size` bytes on a blocking socket (first: send first)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native", "NeuronaBox's native data plane.", -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  PayloadType.tp_name = "neuronabox.controller._native.Payload";
  PayloadType.tp_basicsize = sizeof(PayloadObject);
  PayloadType.tp_dealloc = payload_dealloc;
  PayloadType.tp_as_buffer = &payload_as_buffer;
  PayloadType.tp_as_sequence = &payload_as_sequence;
  PayloadType.tp_richcompare = payload_richcompare;
  PayloadType.tp_repr = payload_repr;
  PayloadType.tp_flags = Py_TPFLAGS_DEFAULT;
  PayloadType.tp_doc = "Bytes a pair received, held natively and forwarded without a copy (buffer protocol).";
  if (PyType_Ready(&PayloadType) < 0) return nullptr;

  PairType.tp_name = "neuronabox.controller._native.GlooPair";
  PairType.tp_basicsize = sizeof(PairObject);
  PairType.tp_dealloc = pair_dealloc;
  PairType.tp_flags = Py_TPFLAGS_DEFAULT;
  PairType.tp_doc = "One Gloo pair, controller side: frames in and out, socket reads and writes.";
  PairType.tp_methods = pair_methods;
  PairType.tp_getset = pair_getset;
  PairType.tp_init = pair_init;
  PairType.tp_new = PyType_GenericNew;
  if (PyType_Ready(&PairType) < 0) return nullptr;

  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&PayloadType);
  Py_INCREF(&PairType);
  if (PyModule_AddObject(m, "Payload", reinterpret_cast<PyObject*>(&PayloadType)) < 0 ||
      PyModule_AddObject(m, "GlooPair", reinterpret_cast<PyObject*>(&PairType)) < 0 ||
      nbx::py::add_book_types(m) < 0 || nbx::py::add_virtual_types(m) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
