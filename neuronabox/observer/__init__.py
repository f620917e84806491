"""The optional in-process observer, loaded into real ranks through interpreter start-up."""
