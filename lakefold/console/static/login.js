// The login form: the token goes once to POST /login, which answers with a session cookie
// (not the token). X-Lakefold-Request marks the request as sent by the console's own page.
"use strict";

document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const response = await fetch("/login", {method: "POST",
    headers: {"Content-Type": "application/json", "X-Lakefold-Request": "login"},
    body: JSON.stringify({token: document.getElementById("token").value})});
  if (response.ok) {
    location.reload();
    return;
  }
  const body = await response.json().catch(() => ({}));
  document.getElementById("error").textContent = response.status === 429
    ? "Too many wrong tokens: " + (body.error || "wait a minute.")
    : "That is not the token.";
});
