// A nexus subscriber in another language than nexus: follows the journal
// over NATS and prints one JSON line per event, in sequence order, with no
// gap and no duplicate, across reconnects (docs/events.md).
//
//   node subscriber.cjs <state-root>/subscriber.json
//
// NEXUS_SINCE=N resumes after sequence N; NEXUS_PAGE sets the history page.
"use strict";
const fs = require("node:fs");
const { connect, createInbox, JSONCodec } = require("nats");
const { decode } = require("@msgpack/msgpack");

const creds = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const page = Number(process.env.NEXUS_PAGE || 1000);
const json = JSONCodec();
let last = Number(process.env.NEXUS_SINCE || 0); // last sequence printed

// Every change to `last` runs in this one chain, so live messages and
// catch-up pages never interleave.
let chain = Promise.resolve();
const serial = (fn) => (chain = chain.then(fn, fn));

// apply prints m if it is the next event; false means a gap before it.
function apply(m) {
  const seq = Number(m.headers.get("Nats-Sequence"));
  if (seq <= last) return true; // already printed: live and history overlap
  if (seq !== last + 1) return false;
  const e = decode(m.data, { useBigInt64: true });
  process.stdout.write(JSON.stringify({
    seq,
    subject: m.headers.get("Nats-Subject") || m.subject,
    id: Buffer.from(e.id).toString("hex"),
    type: e.t,
    schema: e.v,
    sandbox: e.sb || "",
    ts: String(e.ts),
  }) + "\n");
  last = seq;
  return true;
}

// catchUp pages through nexus.history from last+1 until a short page.
async function catchUp(nc) {
  for (;;) {
    const inbox = createInbox(creds.inbox_prefix || "nexus.reply");
    const sub = nc.subscribe(inbox);
    // A page that stops arriving (the server went away mid-answer: the
    // subscription outlives the reconnect, and its end marker never comes)
    // is given up after 5 s of silence, so the next retry asks again
    // instead of every later catch-up queueing behind this one for ever.
    let stalled = false, ended = false, timer;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => { stalled = true; sub.unsubscribe(); }, 5000);
    };
    arm();
    nc.publish(creds.history || "nexus.history", json.encode({ since: last + 1, max: page }), { reply: inbox });
    let n = 0;
    try {
      for await (const m of sub) {
        arm();
        if (m.headers && m.headers.get("Nexus-History-End") === "1") {
          const err = m.headers.get("Nexus-History-Error");
          if (err) throw new Error("history: " + err);
          ended = true;
          break;
        }
        if (!apply(m)) throw new Error("history skipped a sequence after " + last);
        n++;
      }
    } finally {
      clearTimeout(timer);
      sub.unsubscribe();
    }
    if (stalled || !ended) throw new Error("history: no answer for 5 s after " + last);
    if (n < page) return;
  }
}

// retry keeps catching up while the server is away (a request then times out).
async function retry(nc) {
  for (;;) {
    try {
      return await catchUp(nc);
    } catch (err) {
      if (nc.isClosed()) return;
      process.stderr.write("catch-up: " + err.message + "\n");
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

(async () => {
  const nc = await connect({
    servers: creds.url, user: creds.user, pass: creds.password,
    inboxPrefix: creds.inbox_prefix || "nexus.reply",
    maxReconnectAttempts: -1, reconnectTimeWait: 100, waitOnFirstConnect: true,
  });
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => nc.drain().then(() => process.exit(0)));
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "reconnect") serial(() => retry(nc)); // missed while away
    }
  })();
  // A safety net besides the reconnect event: every second, ask history
  // for anything after the last event printed. Events journaled while no
  // server listened arrive only this way, and a client can come back
  // before the server answers history; a poll that finds nothing is one
  // short page.
  setInterval(() => serial(() => retry(nc)), 1000);
  const live = nc.subscribe(creds.subjects || "nexus.events.>");
  await serial(() => retry(nc));
  process.stderr.write("caught up at " + last + "\n");
  for await (const m of live) {
    await serial(async () => {
      if (!apply(m)) {
        await retry(nc); // a gap: fetch it, then this one is a duplicate or next
        apply(m);
      }
    });
  }
})().catch((err) => {
  process.stderr.write(String(err && err.stack || err) + "\n");
  process.exit(1);
});
