"""The scheduler in the back office. Django's admin loads this module; each subject registers
its own pages."""

from scheduling.jobs import admin as jobs_admin  # noqa: F401
from scheduling.policies import admin as policies_admin  # noqa: F401
from scheduling.reservations import admin as reservations_admin  # noqa: F401
from scheduling.sharing import admin as sharing_admin  # noqa: F401
