from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.db import models


class Member(AbstractBaseUser):
    email = models.EmailField(unique=True)

    USERNAME_FIELD = "email"

    objects = BaseUserManager()
