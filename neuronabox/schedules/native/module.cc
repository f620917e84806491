// Python bindings of the native timing core: `RingTimeline`, `TreeTimeline` and
// `BarrierTimeline`, the closed forms the engine asks once per emulated message
// (timing.py builds them, once per instance).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "ring_timeline.h"
#include "timing_api.h"
#include "tree_barrier_timeline.h"

namespace {

using nbx::timing::RingParams;
using nbx::timing::RingTimeline;

struct RingObject {
  PyObject_HEAD
  RingTimeline* tl;
};

PyTypeObject RingType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// --skew's drawn entry delays (seconds) from a Python sequence; null or None: none.
bool draw_list(PyObject* draws, std::vector<double>* out) {
  if (draws == nullptr || draws == Py_None) return true;
  PyObject* ds = PySequence_Fast(draws, "skew_draws: a sequence of seconds");
  if (ds == nullptr) return false;
  const Py_ssize_t nd = PySequence_Fast_GET_SIZE(ds);
  for (Py_ssize_t i = 0; i < nd; ++i) {
    const double d = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(ds, i));
    if (d == -1.0 && PyErr_Occurred()) {
      Py_DECREF(ds);
      return false;
    }
    out->push_back(d);
  }
  Py_DECREF(ds);
  return true;
}

int ring_init(PyObject* obj, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"world", "real", "data_goes_down", "t0", "pace", "work", "modeled", "stragglers",
                             "skew_draws", "skew_shift", "skew_seed", "hold_real", nullptr};
  auto* self = reinterpret_cast<RingObject*>(obj);
  RingParams p;
  PyObject *real, *stragglers, *draws = nullptr;
  int down = 1, modeled = 1;
  unsigned long long seed = 0;
  int hold = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOpdddpO!|OdKp", const_cast<char**>(kw), &p.world, &real, &down,
                                   &p.t0, &p.pace, &p.work, &modeled, &PyDict_Type, &stragglers, &draws, &p.skew_shift,
                                   &seed, &hold)) {
    return -1;
  }
  p.skew_seed = seed;
  p.hold_real = hold != 0;
  if (!draw_list(draws, &p.skew_draws)) return -1;
  p.data_goes_down = down != 0;
  p.modeled = modeled != 0;
  PyObject* seq = PySequence_Fast(real, "real: a sequence of ranks");
  if (seq == nullptr) return -1;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long r = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (r == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
    if (r < 0 || r >= p.world || (!p.real.empty() && r <= p.real.back())) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_ValueError, "real ranks must be sorted, distinct and in [0, %d)", p.world);
      return -1;
    }
    p.real.push_back(static_cast<int>(r));
  }
  Py_DECREF(seq);
  if (p.world <= 0 || p.real.empty()) {
    PyErr_SetString(PyExc_ValueError, "a ring timeline needs a positive world and a real rank");
    return -1;
  }
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(stragglers, &pos, &key, &value)) {
    const long q = PyLong_AsLong(key);
    const double d = PyFloat_AsDouble(value);
    if (PyErr_Occurred()) return -1;
    p.stragglers.emplace_back(static_cast<int>(q), d);
  }
  delete self->tl;
  self->tl = new (std::nothrow) RingTimeline(std::move(p));
  if (self->tl == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

void ring_dealloc(PyObject* obj) {
  delete reinterpret_cast<RingObject*>(obj)->tl;
  Py_TYPE(obj)->tp_free(obj);
}

RingTimeline* timeline_of(PyObject* obj) {
  RingTimeline* tl = reinterpret_cast<RingObject*>(obj)->tl;
  if (tl == nullptr) PyErr_SetString(PyExc_RuntimeError, "RingTimeline not initialized");
  return tl;
}

// (emu, step) from a fastcall's arguments.
bool two_ints(PyObject* const* args, Py_ssize_t n, int* a, int* b) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "expected (rank, step)");
    return false;
  }
  *a = static_cast<int>(PyLong_AsLong(args[0]));
  *b = static_cast<int>(PyLong_AsLong(args[1]));
  return !PyErr_Occurred();
}

// real_sent(rank, step, t) on any timeline: the parsing all three share.
template <class T>
PyObject* real_sent_on(T* tl, PyObject* const* args, Py_ssize_t n) {
  if (tl == nullptr) return nullptr;
  int rank, step;
  if (n != 3 || !two_ints(args, 2, &rank, &step)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "real_sent(rank, step, t)");
    return nullptr;
  }
  const double t = PyFloat_AsDouble(args[2]);
  if (PyErr_Occurred()) return nullptr;
  tl->real_sent(rank, step, t);
  Py_RETURN_NONE;
}

PyObject* ring_real_sent(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  return real_sent_on(timeline_of(obj), args, n);
}

template <double (RingTimeline::*Fn)(int, int)>
PyObject* ring_query(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  RingTimeline* tl = timeline_of(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble((tl->*Fn)(emu, step));
}

PyObject* ring_boundary_cost(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  RingTimeline* tl = timeline_of(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble(tl->boundary_cost());
}

// at(t0) of any native timeline `tl` behind `obj` (an Obj holding a T*): a new object of
// obj's type, the same timeline for an instance whose emulated ranks enter at t0, nothing sent yet.
template <class T, class Obj>
PyObject* moved_to(PyObject* obj, T* tl, PyObject* const* args, Py_ssize_t n) {
  if (tl == nullptr) return nullptr;
  if (n != 1) {
    PyErr_SetString(PyExc_TypeError, "at(t0)");
    return nullptr;
  }
  auto p = tl->params();
  p.t0 = PyFloat_AsDouble(args[0]);
  if (PyErr_Occurred()) return nullptr;
  PyObject* out = Py_TYPE(obj)->tp_alloc(Py_TYPE(obj), 0);
  if (out == nullptr) return nullptr;
  auto* made = new (std::nothrow) T(std::move(p));
  if (made == nullptr) {
    Py_DECREF(out);
    return PyErr_NoMemory();
  }
  reinterpret_cast<Obj*>(out)->tl = made;
  return out;
}

PyObject* ring_at(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  return moved_to<RingTimeline, RingObject>(obj, timeline_of(obj), args, n);
}

PyMethodDef ring_methods[] = {
    {"at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_at)), METH_FASTCALL,
     "at(t0): the same timeline for an instance whose emulated ranks enter at t0, nothing sent yet."},
    {"real_sent", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_real_sent)), METH_FASTCALL,
     "real_sent(rank, step, t): real `rank`'s boundary send of `step` reached the controller at t."},
    {"ready", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::ready>)),
     METH_FASTCALL, "ready(emu, step): when emulated `emu` may send its message of `step`."},
    {"arrival", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::arrival>)),
     METH_FASTCALL, "arrival(emu, step): when that message reaches its real peer."},
    {"release", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_query<&RingTimeline::release>)),
     METH_FASTCALL, "release(emu, step): when the controller writes it."},
    {"boundary_cost", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(ring_boundary_cost)),
     METH_FASTCALL, "boundary_cost(emu, step): the boundary hop's modeled time (one pace)."},
    {nullptr, nullptr, 0, nullptr},
};

PyObject* get_param(PyObject* obj, void* which) {
  RingTimeline* tl = timeline_of(obj);
  if (tl == nullptr) return nullptr;
  const RingParams& p = tl->params();
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0: return PyLong_FromLong(p.world);
    case 1: return PyFloat_FromDouble(p.t0);
    case 2: return PyFloat_FromDouble(p.pace);
    case 3: return PyFloat_FromDouble(p.work);
    default: return PyBool_FromLong(p.modeled);
  }
}

PyGetSetDef ring_getset[] = {
    {"world", get_param, nullptr, "ranks in the ring", reinterpret_cast<void*>(0)},
    {"t0", get_param, nullptr, "the emulated ranks' entry", reinterpret_cast<void*>(1)},
    {"pace", get_param, nullptr, "c: seconds per two steps", reinterpret_cast<void*>(2)},
    {"work", get_param, nullptr, "w: an emulated receiver's work per edge", reinterpret_cast<void*>(3)},
    {"modeled", get_param, nullptr, "whether the model prices the boundary hop", reinterpret_cast<void*>(4)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// -- the tree and the barrier: one wrapper for both ---------------------------------------
using nbx::timing::BarrierParams;
using nbx::timing::BarrierTimeline;
using nbx::timing::TreeParams;
using nbx::timing::TreeTimeline;

template <class T>
struct Wrapped {
  PyObject_HEAD
  T* tl;
};

PyTypeObject TreeType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject BarrierType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Sorted distinct ranks in [0, world) from a Python sequence.
bool rank_list(PyObject* obj, int world, std::vector<int>* out) {
  PyObject* seq = PySequence_Fast(obj, "real: a sequence of ranks");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long r = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if ((r == -1 && PyErr_Occurred()) || r < 0 || r >= world || (!out->empty() && r <= out->back())) {
      Py_DECREF(seq);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "real ranks must be sorted, distinct and in [0, %d)", world);
      return false;
    }
    out->push_back(static_cast<int>(r));
  }
  Py_DECREF(seq);
  if (world <= 0 || out->empty()) {
    PyErr_SetString(PyExc_ValueError, "a timeline needs a positive world and a real rank");
    return false;
  }
  return true;
}

bool delays(PyObject* dict, std::vector<std::pair<int, double>>* out) {
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    const long q = PyLong_AsLong(key);
    const double d = PyFloat_AsDouble(value);
    if (PyErr_Occurred()) return false;
    out->emplace_back(static_cast<int>(q), d);
  }
  return true;
}

template <class T>
int install(PyObject* obj, T* tl) {
  auto* self = reinterpret_cast<Wrapped<T>*>(obj);
  delete self->tl;
  self->tl = tl;
  if (tl == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

int tree_init(PyObject* obj, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"world", "root", "real", "t0", "latency", "ser", "work", "modeled", "skew", "hold_real",
                             "skew_draws", "skew_shift", "skew_seed", nullptr};
  TreeParams p;
  PyObject *real, *skew, *draws = nullptr;
  int modeled = 1, hold = 0;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiOddddpO!|pOdK", const_cast<char**>(kw), &p.world, &p.root, &real,
                                   &p.t0, &p.latency, &p.ser, &p.work, &modeled, &PyDict_Type, &skew, &hold, &draws,
                                   &p.skew_shift, &seed)) {
    return -1;
  }
  p.modeled = modeled != 0;
  p.hold_real = hold != 0;
  p.skew_seed = seed;
  if (!rank_list(real, p.world, &p.real) || !delays(skew, &p.skew) || !draw_list(draws, &p.skew_draws)) return -1;
  if (p.root < 0 || p.root >= p.world) {
    PyErr_Format(PyExc_ValueError, "root %d outside [0, %d)", p.root, p.world);
    return -1;
  }
  return install(obj, new (std::nothrow) TreeTimeline(std::move(p)));
}

int barrier_init(PyObject* obj, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"world", "real", "t0", "latency", "work", "modeled", "stragglers", "hold_real",
                             "skew_draws", "skew_shift", "skew_seed", nullptr};
  BarrierParams p;
  PyObject *real, *stragglers, *draws = nullptr;
  int modeled = 1, hold = 0;
  unsigned long long seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOdddpO!|pOdK", const_cast<char**>(kw), &p.world, &real, &p.t0,
                                   &p.latency, &p.work, &modeled, &PyDict_Type, &stragglers, &hold, &draws,
                                   &p.skew_shift, &seed)) {
    return -1;
  }
  p.modeled = modeled != 0;
  p.hold_real = hold != 0;
  p.skew_seed = seed;
  if (!rank_list(real, p.world, &p.real) || !delays(stragglers, &p.stragglers) || !draw_list(draws, &p.skew_draws)) {
    return -1;
  }
  return install(obj, new (std::nothrow) BarrierTimeline(std::move(p)));
}

template <class T>
void wrapped_dealloc(PyObject* obj) {
  delete reinterpret_cast<Wrapped<T>*>(obj)->tl;
  Py_TYPE(obj)->tp_free(obj);
}

template <class T>
T* wrapped_of(PyObject* obj) {
  T* tl = reinterpret_cast<Wrapped<T>*>(obj)->tl;
  if (tl == nullptr) PyErr_SetString(PyExc_RuntimeError, "timeline not initialized");
  return tl;
}

template <class T>
PyObject* wrapped_real_sent(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  return real_sent_on(wrapped_of<T>(obj), args, n);
}

template <class T, double (T::*Fn)(int, int)>
PyObject* wrapped_query(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  T* tl = wrapped_of<T>(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble((tl->*Fn)(emu, step));
}

template <class T>
PyObject* wrapped_boundary_cost(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  T* tl = wrapped_of<T>(obj);
  int emu, step;
  if (tl == nullptr || !two_ints(args, n, &emu, &step)) return nullptr;
  return PyFloat_FromDouble(tl->boundary_cost());
}

template <class T>
PyObject* wrapped_at(PyObject* obj, PyObject* const* args, Py_ssize_t n) {
  return moved_to<T, Wrapped<T>>(obj, wrapped_of<T>(obj), args, n);
}

PyCFunction fast(PyObject* (*fn)(PyObject*, PyObject* const*, Py_ssize_t)) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn));
}

template <class T>
PyMethodDef* methods_of() {
  static PyMethodDef methods[] = {
      {"at", fast(wrapped_at<T>), METH_FASTCALL,
       "at(t0): the same timeline for an instance whose emulated ranks enter at t0, nothing sent yet."},
      {"real_sent", fast(wrapped_real_sent<T>), METH_FASTCALL,
       "real_sent(rank, step, t): real `rank`'s boundary send of `step` reached the controller at t."},
      {"arrival", fast(wrapped_query<T, &T::arrival>), METH_FASTCALL,
       "arrival(emu, step): when emulated `emu`'s message of `step` reaches its real peer."},
      {"release", fast(wrapped_query<T, &T::release>), METH_FASTCALL,
       "release(emu, step): when the controller writes it."},
      {"boundary_cost", fast(wrapped_boundary_cost<T>), METH_FASTCALL,
       "boundary_cost(emu, step): the boundary hop's modeled time."},
      {nullptr, nullptr, 0, nullptr},
  };
  return methods;
}

template <class T>
bool ready_type(PyTypeObject* type, const char* name, const char* doc, initproc init) {
  type->tp_name = name;
  type->tp_basicsize = sizeof(Wrapped<T>);
  type->tp_dealloc = wrapped_dealloc<T>;
  type->tp_flags = Py_TPFLAGS_DEFAULT;
  type->tp_doc = doc;
  type->tp_methods = methods_of<T>();
  type->tp_init = init;
  type->tp_new = PyType_GenericNew;
  return PyType_Ready(type) == 0;
}

bool add_type(PyObject* m, const char* name, PyTypeObject* type) {
  Py_INCREF(type);
  if (PyModule_AddObject(m, name, reinterpret_cast<PyObject*>(type)) < 0) {
    Py_DECREF(type);
    return false;
  }
  return true;
}

// -- the C API (timing_api.h) ------------------------------------------------------------
enum ApiKind { kRing = 0, kTree = 1, kBarrier = 2 };

void* api_native_of(PyObject* obj, int* kind) {
  if (Py_IS_TYPE(obj, &RingType)) {
    *kind = kRing;
    return reinterpret_cast<RingObject*>(obj)->tl;
  }
  if (Py_IS_TYPE(obj, &TreeType)) {
    *kind = kTree;
    return reinterpret_cast<Wrapped<TreeTimeline>*>(obj)->tl;
  }
  if (Py_IS_TYPE(obj, &BarrierType)) {
    *kind = kBarrier;
    return reinterpret_cast<Wrapped<BarrierTimeline>*>(obj)->tl;
  }
  return nullptr;
}

double api_release(void* tl, int kind, int emu, int step) {
  switch (kind) {
    case kRing:
      return static_cast<RingTimeline*>(tl)->release(emu, step);
    case kTree:
      return static_cast<TreeTimeline*>(tl)->release(emu, step);
    default:
      return static_cast<BarrierTimeline*>(tl)->release(emu, step);
  }
}

void api_real_sent(void* tl, int kind, int rank, int step, double t) {
  switch (kind) {
    case kRing:
      static_cast<RingTimeline*>(tl)->real_sent(rank, step, t);
      break;
    case kTree:
      static_cast<TreeTimeline*>(tl)->real_sent(rank, step, t);
      break;
    default:
      static_cast<BarrierTimeline*>(tl)->real_sent(rank, step, t);
  }
}

nbx::timing::TimingApi g_api = {nbx::timing::kTimingApiVersion, api_native_of, api_release, api_real_sent};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_timing", "NeuronaBox's native timing core.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__timing(void) {
  RingType.tp_name = "neuronabox.schedules._timing.RingTimeline";
  RingType.tp_basicsize = sizeof(RingObject);
  RingType.tp_dealloc = ring_dealloc;
  RingType.tp_flags = Py_TPFLAGS_DEFAULT;
  RingType.tp_doc = "Release times of a ring's emulated messages: the closed form, per message.";
  RingType.tp_methods = ring_methods;
  RingType.tp_getset = ring_getset;
  RingType.tp_init = ring_init;
  RingType.tp_new = PyType_GenericNew;
  if (PyType_Ready(&RingType) < 0) return nullptr;
  if (!ready_type<TreeTimeline>(&TreeType, "neuronabox.schedules._timing.TreeTimeline",
                                "Release times of a binomial broadcast's emulated messages.", tree_init) ||
      !ready_type<BarrierTimeline>(&BarrierType, "neuronabox.schedules._timing.BarrierTimeline",
                                   "Release times of a dissemination barrier's emulated messages.", barrier_init)) {
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  if (!add_type(m, "RingTimeline", &RingType) || !add_type(m, "TreeTimeline", &TreeType) ||
      !add_type(m, "BarrierTimeline", &BarrierType)) {
    Py_DECREF(m);
    return nullptr;
  }
  PyObject* api = PyCapsule_New(&g_api, nbx::timing::kTimingApiCapsule, nullptr);
  if (api == nullptr || PyModule_AddObject(m, "_api", api) < 0) {
    Py_XDECREF(api);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
