"""The cuda backend: driver (ctypes on libcuda), caching allocator, launcher, graphs."""
