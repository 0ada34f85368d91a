// Remix Studio Queue service worker: shows finish notifications sent by Web Push and opens
// the project when one is clicked. Served from /sw.js so its scope is the whole site.
"use strict";

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

function sameOriginUrl(url) {
  // Only our own pages: a push payload cannot send the user elsewhere.
  try {
    const target = new URL(url || "/", self.location.origin);
    return target.origin === self.location.origin ? target.href : self.location.origin + "/";
  } catch (e) {
    return self.location.origin + "/";
  }
}

self.addEventListener("push", (event) => {
  let data = {};
  try {
    data = event.data ? event.data.json() : {};
  } catch (e) {
    data = { body: event.data ? event.data.text() : "" };
  }
  const title = data.title || "Remix Studio Queue";
  const options = {
    body: data.body || "",
    // One notification per project: a newer finish replaces the older one.
    tag: data.tag || "remix-studio",
    renotify: true,
    data: { url: sameOriginUrl(data.url), run: data.run },
  };
  event.waitUntil(showOnce(title, options));
});

// A run's notification is shown once. The server sends at least once (a sender killed
// mid-send sends again), so a copy of one already shown — same tag and run id, whether
// it is still on screen or was dismissed — is dropped instead of alerting twice.
const SHOWN = "rsq-shown-runs";

async function showOnce(title, options) {
  const run = options.data.run;
  if (run === undefined || run === null) return self.registration.showNotification(title, options);
  const key = new Request(`${self.location.origin}/__shown__/${encodeURIComponent(options.tag)}/${encodeURIComponent(run)}`);
  const onScreen = await self.registration.getNotifications({ tag: options.tag });
  const shown = await caches.open(SHOWN);
  if (onScreen.some((n) => n.data && n.data.run === run) || (await shown.match(key))) return;
  await shown.put(key, new Response("1"));
  return self.registration.showNotification(title, options);
}

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const url = sameOriginUrl(event.notification.data && event.notification.data.url);
  event.waitUntil(
    self.clients.matchAll({ type: "window", includeUncontrolled: true }).then((windows) => {
      for (const client of windows) {
        if (client.url === url && "focus" in client) return client.focus();
      }
      // Else reuse one of our windows (windows are same-origin by definition), or open one.
      const open = windows.find((client) => "navigate" in client && "focus" in client);
      if (open) return open.navigate(url).then((client) => (client || open).focus());
      return self.clients.openWindow(url);
    })
  );
});
