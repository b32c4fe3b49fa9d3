"""Log in and out of the web UI (a Flask session cookie; users come from ``rlreg user create``).

The login form carries a CSRF token. Failed attempts count per client address and per (user
name, client address) (``LOGIN_MAX_FAILURES_PER_CLIENT`` / ``LOGIN_MAX_FAILURES_PER_USER_AND_CLIENT``
within ``LOGIN_WINDOW_SECONDS``): past the limit that client backs off (429 with ``Retry-After``,
without checking the password); other clients, the right password among them, are not slowed.
A login starts a server-side session (``PERMANENT_SESSION_LIFETIME``, ``RLREG_SESSION_HOURS``);
logging out ends it in the database, so a saved copy of the cookie stops working too. Logging
out is a POST (a CSRF-protected form in the top bar), so no link can log a user out.
"""
from __future__ import annotations

from flask import Blueprint, current_app, flash, g, redirect, render_template, request, session, url_for
from flask_wtf import FlaskForm
from wtforms import PasswordField, StringField
from wtforms.validators import DataRequired, Length

from registry.store.auth import AuthError, check_password, end_session, start_session
from registry.web.context import get_registry
from registry.web.security import SESSION_ID_KEY, TooManyAttempts, client_keys, safe_next, throttle

bp = Blueprint("auth", __name__)


class LoginForm(FlaskForm):
    username = StringField("User name", validators=[DataRequired(), Length(max=100)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=1000)])


class LogoutForm(FlaskForm):
    pass


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    next_url = safe_next(request.args.get("next")) or safe_next(request.form.get("next"))
    error = None
    status = 200
    if request.method == "POST":
        status = 400
        if form.validate_on_submit():
            username = form.username.data.strip()
            keys = client_keys(username)
            try:
                throttle().check(keys)
            except TooManyAttempts as exc:
                error, status = str(exc), 429
                response = current_app.make_response(
                    (render_template("login.html", form=form, error=error, next_url=next_url), status))
                response.headers["Retry-After"] = str(exc.retry_after)
                return response
            try:
                principal = check_password(get_registry(), username, form.password.data)
            except AuthError as exc:
                throttle().fail(keys)
                error, status = str(exc), 401
                current_app.logger.warning("failed login for %r from %s", username, request.remote_addr)
            else:
                throttle().reset(keys[-1])
                session.clear()  # a fresh session: nothing from before the login survives it
                lifetime = current_app.permanent_session_lifetime.total_seconds()
                session[SESSION_ID_KEY] = start_session(get_registry(), principal.username, lifetime)
                session.permanent = True
                g.pop("rlreg_principal", None)
                flash(f"Logged in as {principal.username}.", "success")
                return redirect(next_url or url_for("ui.runs"))
    response = current_app.make_response(
        (render_template("login.html", form=form, error=error, next_url=next_url), status))
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.post("/logout")
def logout():
    # The global CSRF check has already validated the form's token.
    session_id = session.get(SESSION_ID_KEY)
    session.clear()
    if isinstance(session_id, str) and session_id:
        end_session(get_registry(), session_id)
        flash("Logged out.", "info")
    return redirect(url_for("ui.runs"))
