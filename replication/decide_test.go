package replication

import "testing"

func TestDecideSync(t *testing.T) {
	g1, g2, g3 := NewGeneration(), NewGeneration(), NewGeneration()
	var zero Generation
	cases := []struct {
		name string
		in   SyncInput
		want SyncKind
	}{
		{"peer current equals my current", SyncInput{Current: g1, Peer: g1}, NoSync},
		{"peer current equals my current even with a bitmap", SyncInput{Current: g2, Bitmap: g1, HaveBitmap: true, Peer: g2}, NoSync},
		{"peer current equals my bitmap generation", SyncInput{Current: g2, Bitmap: g1, HaveBitmap: true, Peer: g1}, BitmapSync},
		{"peer matches a bitmap generation I no longer have", SyncInput{Current: g2, Bitmap: g1, HaveBitmap: false, History: []Generation{g1}, Peer: g1}, FullSync},
		{"peer has no consistent data", SyncInput{Current: g1, Peer: zero}, FullSync},
		{"peer holds an older generation of mine", SyncInput{Current: g1, History: []Generation{g2, g3}, Peer: g3}, FullSync},
		{"peer has no consistent data and my bitmap starts from zero", SyncInput{Current: g1, Bitmap: zero, HaveBitmap: true, Peer: zero}, FullSync},
		{"peer generation unknown to me: unrelated data", SyncInput{Current: g1, Bitmap: g2, HaveBitmap: true, History: []Generation{g2}, Peer: g3}, Refuse},
		{"I have no consistent data either", SyncInput{Current: zero, Peer: zero}, FullSync},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := DecideSync(c.in)
			if d.Kind != c.want {
				t.Fatalf("got %v (%s), want %v", d.Kind, d.Rule, c.want)
			}
			if d.Rule == "" {
				t.Fatal("decision names no rule")
			}
		})
	}
}

func TestGenerationText(t *testing.T) {
	g := NewGeneration()
	b, _ := g.MarshalText()
	var h Generation
	if err := h.UnmarshalText(b); err != nil || h != g {
		t.Fatalf("round trip: %v %v", err, h == g)
	}
	if err := h.UnmarshalText([]byte("xyz")); err == nil {
		t.Fatal("accepted a bad generation")
	}
}
