package main

// The page-cache state of the targets' files (issue 19): nbdkit writes its
// image in the sizes fio sends, replvol writes its disk in 64 KiB pieces,
// so a prefill (and every 1M run) leaves nbdkit's file in large page-cache
// folios that each later 8K write walks whole, and replvol's in small
// ones. Under --page-cache drop every run starts from the same state:
//
//   - the prefill writes every target through NBD in 64 KiB blocks, the
//     size replvol writes its disk in;
//   - before every measured run, every regular file of every target
//     (images, metadata, state) is written back (fdatasync) and dropped
//     from the page cache (POSIX_FADV_DONTNEED), and mincore counts what
//     is still resident. Nothing is left cached, so no run walks folios
//     another run left, and each run pays its own writeback.
//
// Per file, unlike `echo 3 > /proc/sys/vm/drop_caches`: it needs no root
// and leaves the caches of whatever else runs on the machine alone.
// --page-cache keep is the old state (1 MiB prefill, sync between runs,
// the cache as the runs leave it), to measure what the difference is.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Page-cache modes (--page-cache).
const (
	cacheDrop = "drop"
	cacheKeep = "keep"
)

// pageCacheHow says what a mode does, for the tables and the book.
func pageCacheHow(mode string) string {
	if mode == cacheKeep {
		return "keep (the old state): every target prefilled through NBD with 1 MiB writes, `sync` between runs, " +
			"the page cache as the runs leave it (nbdkit's file in large folios, replvol's in 64 KiB pieces)"
	}
	return "drop: every target prefilled through NBD with 64 KiB writes (the size replvol writes its disk in); before every measured run " +
		"each regular file of every target written back (fdatasync) and dropped from the page cache (POSIX_FADV_DONTNEED, per file: " +
		"no root, the rest of the machine untouched), mincore checking that nothing stayed resident"
}

// residentNote says, after the page-cache description, how much stayed
// resident after the drops (nothing under --page-cache keep: no drops).
func residentNote(rep *report) string {
	if rep.PageCacheMode != cacheDrop {
		return ""
	}
	return fmt.Sprintf(" (the most that stayed resident after a drop: %s of the targets' files)", fmtBytes(rep.PageCacheResident))
}

// prefillBlock is the block size of the prefill in a mode.
func prefillBlock(mode string) string {
	if mode == cacheKeep {
		return "1m"
	}
	return "64k"
}

// regularFiles lists the regular files at the paths (a directory is
// walked); a path that does not exist is skipped.
func regularFiles(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.Type().IsRegular() {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return files, nil
}

// dropFileCaches writes back and drops from the page cache every regular
// file at the paths, and returns how many bytes of them are still resident
// after (pages another process maps or keeps dirty stay).
func dropFileCaches(paths []string) (resident int64, err error) {
	files, err := regularFiles(paths)
	if err != nil {
		return 0, err
	}
	for _, file := range files {
		n, err := dropFileCache(file)
		if err != nil {
			return 0, err
		}
		resident += n
	}
	return resident, nil
}

func dropFileCache(file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) { // removed meanwhile (a temporary file)
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.Fdatasync(fd); err != nil {
		return 0, fmt.Errorf("%s: fdatasync: %w", file, err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		return 0, fmt.Errorf("%s: fadvise DONTNEED: %w", file, err)
	}
	return residentBytes(f)
}

// residentBytes is how much of f the page cache holds (mincore).
func residentBytes(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size == 0 {
		return 0, nil
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("%s: mmap: %w", f.Name(), err)
	}
	defer unix.Munmap(data)
	page := int64(os.Getpagesize())
	vec := make([]byte, (size+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, fmt.Errorf("%s: mincore: %w", f.Name(), errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += page
		}
	}
	return n, nil
}
