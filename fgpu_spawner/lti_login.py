"""LMS login (LTI 1.3, and LTI 1.1 where a site still has it) that puts students in their course
(docs/source/howto/logins.md, "LMS login").

`LTICourseAuthenticator` is jupyterhub-ltiauthenticator's LTI 1.3 authenticator, configured as
that one is (`c.LTI13Authenticator.*`), with three additions:

- a verified launch puts the person in the hub group of its LMS course and makes an LMS
  instructor the course's instructor (fgpu_spawner/lti_courses.py);
- LTI 1.1 launches are taken too, at `/hub/lti/launch`, once `c.LTI11Authenticator.consumers`
  names a consumer key (one authenticator, so a site moving from 1.1 to 1.3 runs both);
- a refused launch says why in words a student can act on, and a launch's nonce works once
  (upstream ties it to a cookie only: whoever held the cookies could post the same launch again).
"""

from __future__ import annotations

import jwt
from cachetools import TTLCache
from jupyterhub.handlers import BaseHandler
from ltiauthenticator.lti11.auth import LTI11Authenticator
from ltiauthenticator.lti11.handlers import LTI11AuthenticateHandler
from ltiauthenticator.lti13.auth import LTI13Authenticator
from ltiauthenticator.lti13.error import InvalidAudienceError, ValidationError
from ltiauthenticator.lti13.handlers import LTI13CallbackHandler, LTI13LoginInitHandler
from ltiauthenticator.utils import convert_request_to_dict
from tornado import web
from traitlets import Dict, Instance, Set, Unicode, default

from .lti_courses import (
    CourseLaunch,
    course_launch,
    join_course,
    lti11_course,
    lti13_course,
    refuse_a_group_with_roles,
)

#: The key of an authentication model that carries the launch's course to the handler.
LAUNCH_KEY = "fgpu_course_launch"
REFUSED = "Launch refused"
AGAIN = "Open the tool again from your course page in the LMS."
#: How long a used LTI 1.3 nonce is remembered: past it, the token's age refuses it anyway.
NONCE_MEMORY_SECONDS = 3600

SIGNATURE = (
    "This launch is not signed with your course platform's key, so the hub cannot trust it. "
    f"{AGAIN} If it fails again, tell your instructor: the hub's admin may need the platform's "
    "new key."
)
EXPIRED = (
    f"This launch has expired: a launch from your course is good for a few minutes only. {AGAIN}"
)
USED = (
    "This launch was already used, or it did not start in this browser: each launch works "
    f"once. {AGAIN}"
)
UNKNOWN_PLATFORM = (
    "This launch comes from a course platform the hub does not know. Tell your instructor: "
    "the hub's admin registers the platform (its client id or consumer key)."
)
FROM_THE_LMS = (
    "This hub logs you in through your course: open the tool from your course page in the LMS "
    "(Canvas, Moodle, ...), not from this address."
)


def refusal(status: int, message: str) -> web.HTTPError:
    """An error page a student reads: the status, 'Launch refused', and what to do."""
    return web.HTTPError(status, message.replace("%", "%%"), reason=REFUSED)


class CourseJoiningHandler(BaseHandler):
    """A login handler that puts the person in their launch's course once they are logged in."""

    async def auth_to_user(self, authenticated, user=None):
        launch: CourseLaunch | None = authenticated.pop(LAUNCH_KEY, None)
        if launch is not None:
            # Before the account is made: a refused launch leaves nobody behind.
            refuse_a_group_with_roles(self.db, launch)
        user = await super().auth_to_user(authenticated, user)
        if launch is not None:
            join_course(self.db, user.orm_user, launch)
        return user


class CourseLoginInitHandler(LTI13LoginInitHandler):
    """The LTI 1.3 login initiation; a visit without the platform's arguments (a student who
    opens /hub/login) is told where to log in."""

    def post(self):
        missing = [
            a for a in ("iss", "login_hint", "target_link_uri") if not self.get_argument(a, "")
        ]
        if missing:
            raise refusal(400, FROM_THE_LMS)
        return super().post()

    get = post


class CourseLaunchHandler(CourseJoiningHandler, LTI13CallbackHandler):
    """The LTI 1.3 launch (the platform's form post of its signed id_token)."""

    def decode_and_validate_launch_request(self):
        try:
            id_token = super().decode_and_validate_launch_request()
        except ValidationError as e:
            raise token_refusal(e) from e
        except web.HTTPError as e:
            # The state or nonce cookie is missing or does not match: a launch posted again,
            # or one that another browser started.
            raise refusal(400 if "state" in str(e.log_message) else 403, USED) from e
        self.authenticator.use_nonce(id_token.get("nonce"))
        return id_token


def token_refusal(error: ValidationError) -> web.HTTPError:
    """The refusal of an id_token the validator turned down."""
    cause = error.__context__
    if isinstance(cause, jwt.ExpiredSignatureError) or "too long ago" in str(error):
        return refusal(401, EXPIRED)
    if isinstance(cause, jwt.InvalidSignatureError | jwt.PyJWKClientError | jwt.DecodeError):
        return refusal(401, SIGNATURE)
    if isinstance(error, InvalidAudienceError) or isinstance(cause, jwt.InvalidIssuerError):
        return refusal(401, UNKNOWN_PLATFORM)
    return refusal(400, f"This launch lacks what the hub needs ({error}). Tell your instructor.")


class CourseLTI11Handler(CourseJoiningHandler, LTI11AuthenticateHandler):
    """The LTI 1.1 launch (the consumer's OAuth 1 signed form post)."""


def lti11_refusal(error: web.HTTPError) -> web.HTTPError:
    """The refusal of an LTI 1.1 launch that ltiauthenticator's validator turned down."""
    text = str(error.log_message)
    if "signature" in text:
        return refusal(401, SIGNATURE)
    if "already used" in text:
        return refusal(403, USED)
    if "Timestamp" in text or "timestamp" in text:
        return refusal(401, EXPIRED)
    if "consumer_key" in text:
        return refusal(401, UNKNOWN_PLATFORM)
    return refusal(400, f"This launch lacks what the hub needs ({text}). Tell your instructor.")


class LTICourseAuthenticator(LTI13Authenticator):
    """LTI 1.3 (and 1.1) login whose launches put students in their LMS course's hub group."""

    login_handler = CourseLoginInitHandler
    callback_handler = CourseLaunchHandler

    course_groups = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""
        LMS courses (their LTI context id, as the platform sends it) mapped to the hub group
        each one joins, for a course that already exists on the hub (made by an admin, or with
        a name people know). A context not named here joins the group `course_group_template`
        names.

        Example::

            c.LTICourseAuthenticator.course_groups = {"3f1b9c0e2a": "cs101"}
        """,
    )

    course_group_template = Unicode(
        "lti-{context_id}",
        config=True,
        help="""
        The hub group a launch from an LMS course not in `course_groups` joins, made (and made a
        course) at its first launch. `{context_id}` is the LTI context id, `{platform}` the LTI
        1.3 issuer's host or the LTI 1.1 consumer key: put it in when several platforms launch
        into this hub, whose context ids may be the same. Characters a group name cannot hold
        become `-`. Empty: only the courses in `course_groups` take launches into a group (the
        others log in all the same, into no course).

        Example::

            c.LTICourseAuthenticator.course_group_template = "lms-{platform}-{context_id}"
        """,
    )

    instructor_roles = Set(
        Unicode(),
        default_value={
            "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor",
            "Instructor",
            "urn:lti:role:ims/lis/Instructor",
        },
        config=True,
        help="""
        The LMS roles (the LTI 1.3 roles claim, or LTI 1.1's `roles`) that make the person an
        instructor of the launch's course. The default is the course-level Instructor role of
        LTI 1.3 and 1.1 alone: an institution role ("instructor somewhere at the university")
        says nothing about this course, and a learner never becomes an instructor. Add a
        teaching assistant's role if they should stop and open their students' sessions.

        Example::

            c.LTICourseAuthenticator.instructor_roles = {
                "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor",
                "http://purl.imsglobal.org/vocab/lis/v2/membership/Instructor#TeachingAssistant",
            }
        """,
    )

    lti11 = Instance(
        LTI11Authenticator, help="The LTI 1.1 verifier, set from c.LTI11Authenticator."
    )

    @default("lti11")
    def _lti11(self):
        return LTI11Authenticator(parent=self)

    @default("allow_all")
    def _allow_all(self):
        # A launch signed by a platform the hub trusts is the permission to log in: the LMS
        # decides who is in its courses.
        return True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._used_nonces: TTLCache = TTLCache(maxsize=1_000_000, ttl=NONCE_MEMORY_SECONDS)

    def get_handlers(self, app):
        handlers = super().get_handlers(app)
        if self.lti11.consumers:
            handlers.append(("/lti/launch", CourseLTI11Handler))
        return handlers

    def use_nonce(self, nonce: str | None) -> None:
        """Refuse an id_token whose nonce a launch used before; remember this one."""
        if not nonce or nonce in self._used_nonces:
            raise refusal(403, USED)
        self._used_nonces[nonce] = True

    async def authenticate(self, handler, data=None):
        if isinstance(handler, CourseLTI11Handler):
            try:
                model = await self.lti11.authenticate(handler, data)
            except web.HTTPError as e:
                raise lti11_refusal(e) from e
            found = lti11_course(convert_request_to_dict(handler.request.arguments))
        else:
            model = await super().authenticate(handler, data)
            found = lti13_course(data or {})
        launch = course_launch(
            found, self.course_groups, self.course_group_template, self.instructor_roles
        )
        return {**model, LAUNCH_KEY: launch} if launch else model
