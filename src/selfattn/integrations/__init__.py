"""Optional adapters that plug selfattn into other libraries.

Each adapter is a module of its own (``selfattn.integrations.transformers``) that imports
its library, and is imported only when asked for: importing ``selfattn`` or this package
never imports transformers or any other optional dependency.
"""
