"""The owner of an agent token, named on a command line: an existing user, or a clear error."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import CommandError

OWNER_HELP = ("Username of the person responsible for this agent (required). Four eyes: the owner cannot approve "
              "what the agent asks for. Create the user first (manage.py createsuperuser, or the admin).")


def existing_user(username: str) -> User:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"--owner: no user {username!r}; create it first (manage.py createsuperuser or the admin)")
    return user
