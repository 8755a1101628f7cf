// A stand-in for the NVIDIA driver's libcuda.so.1 that the real-node suite
// puts into the mock driver root, named as the driver names the file
// (libcuda.so.<version>, soname libcuda.so.1): a container of cudaapp
// shows it found this through the driver files of its claim.
int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

int cuDriverGetVersion(int *version) {
	*version = 12040;
	return 0;
}

const char *hwdra_standin(void) { return "hwdra-mock-libcuda"; }
