package transport

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// fill sets every field of v (a pointer) as large as a real cluster makes
// it: strings of 64 characters (the longest name; reasons run longer, names shorter), numbers at their
// largest, and count(type) elements in each slice or map.
func fill(v reflect.Value, count func(reflect.Type) int) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		if v.Type().Elem().PkgPath() == "time" {
			return
		}
		fill(v.Elem(), count)
	case reflect.Struct:
		if v.Type().PkgPath() == "time" {
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), count)
			}
		}
	case reflect.String:
		v.SetString(strings.Repeat("x", 64))
	case reflect.Int, reflect.Int64:
		v.SetInt(1 << 62)
	case reflect.Uint64:
		v.SetUint(1 << 63)
	case reflect.Float64:
		v.SetFloat(1.2345678901234567e300)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		n := count(v.Type().Elem())
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := 0; i < n; i++ {
			fill(v.Index(i), count)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for i := 0; i < count(v.Type().Elem()); i++ {
			k := reflect.New(v.Type().Key()).Elem()
			k.SetString(strings.Repeat("k", 10) + string(rune('a'+i)))
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e, count)
			v.SetMapIndex(k, e)
		}
	}
}

// TestTheLargestStatusFitsTheReplyLimit: the largest replies of the
// control API, the status of a cluster of a thousand volumes with three
// replicas of four paths each (a node's own view with its events too),
// every field at its longest, stay well under MaxControlReply, and a
// request well under MaxControlRequest.
func TestTheLargestStatusFitsTheReplyLimit(t *testing.T) {
	count := func(typ reflect.Type) int {
		switch typ {
		case reflect.TypeFor[VolumeStatus](), reflect.TypeFor[LocalVolume]():
			return 1000
		case reflect.TypeFor[ReplicaStatus](), reflect.TypeFor[NodeInfo]():
			return 3
		case reflect.TypeFor[PathStatus]():
			return 4
		case reflect.TypeFor[PeerStatus]():
			return 2
		case reflect.TypeFor[Event]():
			return 50
		case reflect.TypeFor[Warning]():
			return 100
		}
		return 3
	}
	for _, msg := range []any{&ClusterStatus{}, &NodeStatus{}} {
		fill(reflect.ValueOf(msg), count)
		b, err := json.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%T: %.1f MB", msg, float64(len(b))/1e6)
		if len(b) > MaxControlReply/4 {
			t.Errorf("%T of a thousand volumes is %d bytes: more than a quarter of MaxControlReply (%d)", msg, len(b), MaxControlReply)
		}
	}
	for _, req := range []any{&PrimaryRequest{}, &ConnectRequest{}, &AdjustRequest{}, &PathRequest{}, &MembershipRequest{}, &ResyncRequest{}, &VerifyRequest{}, &EventsRequest{}} {
		fill(reflect.ValueOf(req), func(reflect.Type) int { return 3 })
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxControlRequest/16 {
			t.Errorf("%T is %d bytes: more than a sixteenth of MaxControlRequest (%d)", req, len(b), MaxControlRequest)
		}
	}
}
