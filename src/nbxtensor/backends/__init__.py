"""Device backends: cpu (NumPy implementations), cuda (driver, allocator, launcher), interp."""
