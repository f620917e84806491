// What the two binding files share: the pair's Python object (with the routes that
// hand its events to collective books natively) and the payload wrappers.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
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

struct PairObject {
  PyObject_HEAD
  gloo::Pair* pair;
  int fd;                      // the socket, once the driver has one (-1: none; frames are taken)
  std::vector<Route>* routes;  // books that take this pair's events natively
};

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

// Receives what the socket has for the pair and dispatches it: the events no book
// takes, None once the socket closed, nullptr with a Python error set.
PyObject* read_pair(PairObject* pair, int fd);

// A Python error is set: unwinds through native code to the binding that returns it.
struct PyErrorSet {};

// Registers Book and Core in the module.
int add_book_types(PyObject* module);

}  // namespace nbx::py
