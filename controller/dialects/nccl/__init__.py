"""The NCCL dialect's sans-IO layer: version tables, wire codecs, clone-and-patch, setup replies, bootstrap plan.

Facts and the tags they were checked against: docs/nccl_wire.md. Nothing here opens a socket.
"""
