"""Who may do what, for every app: roles, API tokens and the permission classes.

Apps ask here (``role_of``, ``at_least``, the DRF permission classes, ``role_required`` for
pages) instead of reading ``is_staff`` themselves, so inventory and scheduling answer alike.
"""
