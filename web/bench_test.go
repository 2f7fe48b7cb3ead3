package web

import (
	"bytes"
	"testing"
)

// The page stays cheap at scale: 50 volumes on 5 nodes (250 replica rows,
// 500 paths, 100 sparklines of five minutes) render in well under 100 ms.
// BenchmarkPage is what GET / costs past the status call;
// BenchmarkStreamFrame what the sampler spends on each frame of the live
// stream, whatever the number of open pages.

func bigInput() pageInput {
	st := bigCluster(50, 5)
	return pageInput{Status: st, IO: bigIO(st, testNow), Now: testNow}
}

func BenchmarkPage(b *testing.B) {
	in := bigInput()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := renderPage(&buf, buildPage(in)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len()), "bytes/page")
}

func BenchmarkStreamFrame(b *testing.B) {
	in := bigInput()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := renderSections(buildPage(in)); err != nil {
			b.Fatal(err)
		}
	}
}
