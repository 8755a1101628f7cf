// cudaapp stands in for a CUDA program, in an image that is not NVIDIA's
// (its own binary and glibc, nothing else): it loads libcuda.so.1 as the
// CUDA runtime does, from wherever the dynamic linker finds it, calls
// cuInit and cuDriverGetVersion and, where the library has them (the real
// driver's does), makes a context on device 0 and reads its
// multiprocessor count and free memory: under MPS those are what the
// client's limits leave it. It prints one line
//
//	=== CUDA <path loaded> cuInit=<ret> version=<v> <stand-in's name> [sms=<n> free=<MiB>MiB total=<MiB>MiB]
//
// and, for an MPS client (CUDA_MPS_PIPE_DIRECTORY set), a second line
//
//	=== MPS pipe=<dir> control=<yes|no> threads=<percentage> memory=<limit>
//
// (or "=== CUDA dlopen failed: <why>") and then sleeps until it is
// stopped (a pod), or exits with "--once" (0 where cuInit succeeded): the
// real-node suite and hack/realgpu-check.sh run it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;

static void *sym(void *h, const char *name) { return dlsym(h, name); }

int main(int argc, char **argv) {
	int once = argc > 1 && strcmp(argv[1], "--once") == 0;
	int status = 1;
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		printf("=== CUDA dlopen failed: %s\n", dlerror());
	} else {
		struct link_map *lm = NULL;
		dlinfo(h, RTLD_DI_LINKMAP, &lm);
		CUresult (*cu_init)(unsigned int) = sym(h, "cuInit");
		CUresult (*get_version)(int *) = sym(h, "cuDriverGetVersion");
		const char *(*standin)(void) = sym(h, "hwdra_standin");
		int version = 0;
		CUresult init = cu_init ? cu_init(0) : -1;
		if (get_version) {
			get_version(&version);
		}
		printf("=== CUDA %s cuInit=%d version=%d %s", lm ? lm->l_name : "?", init, version, standin ? standin() : "nvidia");
		CUresult (*device_get)(int *, int) = sym(h, "cuDeviceGet");
		CUresult (*attribute)(int *, int, int) = sym(h, "cuDeviceGetAttribute");
		CUresult (*ctx_create)(void **, unsigned int, int) = sym(h, "cuCtxCreate_v2");
		CUresult (*mem_info)(size_t *, size_t *) = sym(h, "cuMemGetInfo_v2");
		int dev = 0, sms = 0;
		void *ctx = NULL;
		size_t free_b = 0, total_b = 0;
		// 16: CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
		if (init == 0 && device_get && attribute && ctx_create && mem_info && device_get(&dev, 0) == 0 &&
		    ctx_create(&ctx, 0, dev) == 0 && attribute(&sms, 16, dev) == 0 && mem_info(&free_b, &total_b) == 0) {
			printf(" sms=%d free=%zuMiB total=%zuMiB", sms, free_b >> 20, total_b >> 20);
		}
		printf("\n");
		status = init == 0 ? 0 : 1;
	}
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	if (pipe) {
		char control[4096];
		struct stat st;
		snprintf(control, sizeof control, "%s/control", pipe);
		const char *threads = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
		const char *memory = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
		printf("=== MPS pipe=%s control=%s threads=%s memory=%s\n", pipe, stat(control, &st) == 0 ? "yes" : "no",
		       threads ? threads : "-", memory ? memory : "-");
	}
	fflush(stdout);
	if (once) {
		return status;
	}
	for (;;) {
		pause();
	}
}
