"""The Gloo-over-TCP dialect: wire codec, sans-IO connection machine, socket driver."""
