// replvol status page: follows /api/stream (Server-Sent Events from this
// node) and swaps in the sections that changed. No library, no other host.
// When the stream fails or falls silent, the page says since when it lost
// its node and greys out what it shows: that is the node's last view, not
// the cluster now.
"use strict";
(() => {
	// silentAfter: the node sends the page's time with every sample
	// (about every second while a page is open, a sample lasts at most
	// 3 s): this long without a word, the node is lost.
	const silentAfter = 8000;
	const live = document.getElementById("live");
	const contact = document.getElementById("contact");
	const node = (document.getElementById("page-node") || {}).textContent || "this node";
	let heard = Date.now();
	let lost = false;
	const show = (text, cls) => {
		live.textContent = text;
		live.className = "live " + cls;
	};
	const clock = (ms) => {
		const d = new Date(ms);
		return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
	};
	// lose marks the page stale: what it shows is the node's last view.
	const lose = (why) => {
		if (!lost) {
			lost = true;
			document.body.classList.add("stale");
		}
		contact.textContent = `Lost contact with ${node} since ${clock(heard)} (${why}): what follows is its last view, not the cluster now.`;
		contact.hidden = false;
	};
	const hear = () => {
		heard = Date.now();
		if (lost) {
			lost = false;
			document.body.classList.remove("stale");
			contact.hidden = true;
			contact.textContent = "";
		}
	};
	const apply = (ev) => {
		const msg = JSON.parse(ev.data);
		if (msg.title) document.title = msg.title;
		for (const p of msg.patches || []) {
			const el = document.getElementById(p.id);
			if (el) el.outerHTML = p.html;
		}
		// Problem volumes move to the top.
		const volumes = document.getElementById("volumes");
		for (const id of msg.order || []) {
			const el = document.getElementById(id);
			if (volumes && el && el.parentNode === volumes) volumes.appendChild(el);
		}
		hear();
		show("live", "ok");
	};
	const connect = () => {
		const es = new EventSource("/api/stream");
		es.addEventListener("patch", apply);
		es.onopen = () => show("live", "ok");
		es.onerror = () => {
			if (es.readyState === EventSource.CLOSED) {
				// The node stopped the stream (it is shutting down): try
				// again later, a restarted node serves it again.
				es.close();
				show("node stopped; retrying", "bad");
				lose("the node stopped its stream");
				setTimeout(connect, 3000);
			} else {
				show("reconnecting…", "warn");
				lose("the connection failed");
			}
		};
	};
	setInterval(() => {
		const quiet = Date.now() - heard;
		if (quiet > silentAfter) {
			show("no updates", "bad");
			lose(`no update for ${Math.round(quiet / 1000)} s`);
		}
	}, 1000);
	connect();
})();
