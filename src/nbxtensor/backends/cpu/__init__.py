"""NumPy implementations of the ops for the cpu device, registered with `dispatch.register`.

Every module here is imported on the first cpu dispatch; each registers its functions
under the "numpy" family.
"""
