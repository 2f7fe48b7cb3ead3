// Package mounttree gives tests that mount file systems a directory to mount them under
// whose mounts reach every copy of them: a temporary directory bind-mounted onto itself and
// made a shared mount. A process that another test starts with ip netns exec gets a mount
// namespace of its own, a copy of the test's made a slave of it. Under a private tree the
// copies of a test's mounts stay there after it unmounts them, and the test's replctl
// umount then rightly refuses to detach a loop device still mounted elsewhere; under a
// shared tree the unmounts propagate to the copies, as on a host whose root is shared
// (systemd's default).
package mounttree
