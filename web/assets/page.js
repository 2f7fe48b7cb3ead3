// replvol status page: follows /api/stream (Server-Sent Events from this
// node) and swaps in the sections that changed. No library, no other host.
"use strict";
(() => {
	const live = document.getElementById("live");
	const show = (text, cls) => {
		live.textContent = text;
		live.className = "live " + cls;
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
				setTimeout(connect, 3000);
			} else {
				show("reconnecting…", "warn");
			}
		};
	};
	connect();
})();
