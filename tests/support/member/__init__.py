"""A site's own user model, as many sites have: built on ``AbstractBaseUser``, with no
``is_active`` field (the base class's ``is_active = True`` is an attribute only)."""
